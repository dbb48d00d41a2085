"""The optimizer's prompt as text for a model or a coding-agent CLI: the prompt file's JSON
(instructions, convergence, failing cases with reasons, rejected edits, protected paths) and
excerpts of the read-only context folder, within a byte budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evolane.store import StoreError, read_regular_file

PROMPT_TEXT_BYTES = 48 << 10
"""Bytes of text a built-in optimizer sends for the prompt and the context together."""
_CONTEXT_FILE_BYTES = 4 << 10
_CONTEXT_FILES = 64


def prompt_text(
    prompt: dict[str, Any], context_dir: Path | None, max_bytes: int = PROMPT_TEXT_BYTES
) -> str:
    """``prompt`` (a decoded prompt file) and excerpts of ``context_dir`` as plain text of at
    most ``max_bytes`` UTF-8 bytes: the prompt first, then as much context as fits."""
    lines = [str(prompt.get("instructions", "")).strip(), ""]
    lines.append(
        f"Iteration {prompt.get('iteration')}, convergence {prompt.get('convergence')}, "
        f"focus {prompt.get('focus')}."
    )
    failing = prompt.get("failing") or []
    if failing:
        lines += ["", "Failing cases (id, score, reason):"]
        lines += [f"- {c.get('id')} ({c.get('score')}): {c.get('reason', '')}" for c in failing]
    protect = prompt.get("protect") or []
    if protect:
        lines += ["", f"Cases that pass now and must keep passing: {', '.join(map(str, protect))}"]
    protected = prompt.get("protected_paths") or []
    if protected:
        lines += ["", f"Paths you must not change: {', '.join(map(str, protected))}"]
    for rejected in prompt.get("rejected") or []:
        lines += ["", f"A rejected edit ({rejected.get('reason', '')}):", str(rejected.get("diff"))]
    text = "\n".join(lines)
    budget = max_bytes - len(text.encode())
    if context_dir is not None and budget > 0:
        text += _context_excerpts(context_dir, budget)
    return text.encode()[:max_bytes].decode("utf-8", "ignore")


def _context_excerpts(root: Path, budget: int) -> str:
    """Files of the context folder (index.json first), each cut to a few KiB, in path order,
    walked iteratively and capped in count; never follows a symlink."""
    parts: list[str] = []
    paths: list[Path] = []
    pending = [root]
    while pending and len(paths) < _CONTEXT_FILES:
        folder = pending.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir():
                pending.append(entry)
            elif entry.is_file() and len(paths) < _CONTEXT_FILES:
                paths.append(entry)
    paths.sort(key=lambda p: (p.name != "index.json", str(p)))
    for path in paths:
        try:
            data = read_regular_file(path, 1 << 20)
        except (OSError, StoreError):  # too large, not a regular file, gone
            continue
        excerpt = data[:_CONTEXT_FILE_BYTES].decode("utf-8", "replace")
        part = f"\n\n--- context: {path.relative_to(root)} ---\n{excerpt}"
        if len(part.encode()) > budget:
            break
        budget -= len(part.encode())
        parts.append(part)
    return "".join(parts)


def decode_prompt(data: bytes) -> dict[str, Any]:
    """A prompt file's bytes as a dict (an unreadable one as empty: the text then says little)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
