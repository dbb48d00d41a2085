"""The built-in coding-agent presets: the non-interactive command line each CLI documents,
and how its output reports usage. Each preset's ``interface`` states what it assumes.

Token counts are normalised to one convention: ``input_tokens`` counts every prompt token
(cache reads and writes included), ``cached_input_tokens`` is the part read from a cache,
``output_tokens`` includes reasoning ("thinking") tokens; ``tokens`` is input + output.
A CLI that reports no cost leaves ``cost_usd`` out (the spend is then unknown: fail-closed).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from evolane.lanes._agent_kit import (
    AgentCall,
    AgentPreset,
    cost,
    count,
    field_of,
    json_objects,
    one_line,
)
from evolane.lanes._usage import usage_document

CLAUDE_MAX_TURNS = 40
"""Claude Code's ``--max-turns``: agentic turns per optimizer call (the deadline bounds it too)."""
CLAUDE_TOOLS = "Read,Edit,MultiEdit,Write,Glob,Grep,LS"
"""The tools Claude Code may use: reading and editing files, no shell, no web."""
AIDER_MAX_FILES = 64
"""Files of the workdir aider is given to edit (``--file``), in path order."""
AIDER_MAX_FILE_BYTES = 256 << 10
"""Files larger than this are not given to aider."""


def _total(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# -- Claude Code ----------------------------------------------------------------------------


def _claude_argv(call: AgentCall) -> tuple[str, ...]:
    # The prompt follows -p at once: --allowedTools and --add-dir take several values.
    return (
        call.executable,
        "-p",
        call.prompt_text,
        "--output-format",
        "stream-json",
        "--verbose",
        "--max-turns",
        str(CLAUDE_MAX_TURNS),
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        CLAUDE_TOOLS,
        "--add-dir",
        str(call.context_dir),
    )


def _claude_result(stdout: bytes) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    events = json_objects(stdout)
    results = [e for e in events if e.get("type") == "result"]
    return (results[-1] if results else None), events


def _claude_model(result: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    models = result.get("modelUsage")
    if isinstance(models, dict) and models:
        spent = {name: cost(field_of(info, "costUSD")) or 0.0 for name, info in models.items()}
        return str(max(sorted(spent), key=lambda name: spent[name]))
    for event in events:
        if event.get("type") == "system" and isinstance(event.get("model"), str):
            return str(event["model"])
    return None


def _claude_usage(stdout: bytes) -> dict[str, Any] | None:
    result, events = _claude_result(stdout)
    if result is None:
        return None
    usage = result.get("usage")
    fresh = count(field_of(usage, "input_tokens"))
    read = count(field_of(usage, "cache_read_input_tokens"))
    written = count(field_of(usage, "cache_creation_input_tokens"))
    return usage_document(
        _total([fresh, read, written]),
        count(field_of(usage, "output_tokens")),
        cached_input_tokens=read,
        cost_usd=cost(result.get("total_cost_usd")),
        model=_claude_model(result, events),
    )


def _claude_summary(stdout: bytes) -> str:
    result, _ = _claude_result(stdout)
    return one_line(result.get("result")) if result else ""


CLAUDE_CODE = AgentPreset(
    name="claude-code",
    program="claude",
    argv=_claude_argv,
    usage=_claude_usage,
    summary=_claude_summary,
    env={"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
    interface=(
        "claude -p PROMPT --output-format stream-json --verbose --max-turns N "
        "--permission-mode acceptEdits --allowedTools Read,Edit,... --add-dir CONTEXT; "
        "stdout is JSONL (streamed, so the idle watchdog sees progress) ending in a "
        '{"type": "result", "result", "total_cost_usd", "usage": {input_tokens, '
        "output_tokens, cache_read_input_tokens, cache_creation_input_tokens}, "
        '"modelUsage": {MODEL: {costUSD}}} event; -p --output-format json (one object) '
        "is read the same way."
    ),
)


# -- Codex CLI ------------------------------------------------------------------------------


def _codex_argv(call: AgentCall) -> tuple[str, ...]:
    return (
        call.executable,
        "exec",
        "--json",
        "--sandbox",
        "workspace-write",
        "--skip-git-repo-check",
        "--cd",
        str(call.workdir),
        call.prompt_text,
    )


def _codex_usage(stdout: bytes) -> dict[str, Any] | None:
    turns = [e for e in json_objects(stdout) if e.get("type") == "turn.completed"]
    if not turns:
        return None
    usages = [e.get("usage") for e in turns]
    return usage_document(
        _total([count(field_of(u, "input_tokens")) for u in usages]),
        _total([count(field_of(u, "output_tokens")) for u in usages]),
        cached_input_tokens=_total([count(field_of(u, "cached_input_tokens")) for u in usages]),
    )


def _codex_summary(stdout: bytes) -> str:
    messages = [
        field_of(e, "item", "text")
        for e in json_objects(stdout)
        if e.get("type") == "item.completed" and field_of(e, "item", "type") == "agent_message"
    ]
    return one_line(messages[-1]) if messages else ""


CODEX = AgentPreset(
    name="codex",
    program="codex",
    argv=_codex_argv,
    usage=_codex_usage,
    summary=_codex_summary,
    interface=(
        "codex exec --json --sandbox workspace-write --skip-git-repo-check --cd WORKDIR "
        'PROMPT; stdout is JSONL events: {"type": "turn.completed", "usage": '
        "{input_tokens, cached_input_tokens, output_tokens}} (summed), "
        '{"type": "item.completed", "item": {"type": "agent_message", "text"}}; no cost '
        "and no model are reported (cost unknown)."
    ),
)


# -- Gemini CLI -----------------------------------------------------------------------------


def _gemini_argv(call: AgentCall) -> tuple[str, ...]:
    return (
        call.executable,
        "-p",
        call.prompt_text,
        "--output-format",
        "json",
        "--approval-mode",
        "auto_edit",
        "--include-directories",
        str(call.context_dir),
    )


def _gemini_usage(stdout: bytes) -> dict[str, Any] | None:
    objects = [o for o in json_objects(stdout) if isinstance(field_of(o, "stats", "models"), dict)]
    if not objects:
        return None
    models: dict[str, Any] = field_of(objects[-1], "stats", "models")  # type: ignore[assignment]
    tokens = {name: field_of(info, "tokens") for name, info in models.items()}
    totals = {name: count(field_of(t, "total")) or 0 for name, t in tokens.items()}
    model = max(sorted(totals), key=lambda name: totals[name]) if totals else None
    return usage_document(
        _total([count(field_of(t, "prompt")) for t in tokens.values()]),
        _total(
            [count(field_of(t, key)) for t in tokens.values() for key in ("candidates", "thoughts")]
        ),
        cached_input_tokens=_total([count(field_of(t, "cached")) for t in tokens.values()]),
        model=model,
    )


def _gemini_summary(stdout: bytes) -> str:
    answers = [o.get("response") for o in json_objects(stdout) if "response" in o]
    return one_line(answers[-1]) if answers else ""


GEMINI_CLI = AgentPreset(
    name="gemini-cli",
    program="gemini",
    argv=_gemini_argv,
    usage=_gemini_usage,
    summary=_gemini_summary,
    interface=(
        "gemini -p PROMPT --output-format json --approval-mode auto_edit "
        "--include-directories CONTEXT; stdout is one object at the end "
        '{"response", "stats": {"models": {MODEL: {"tokens": {prompt, candidates, cached, '
        "thoughts, total}}}}}; no cost is reported (cost unknown). Nothing is printed before "
        "the end: set --optimizer-idle above the longest model call."
    ),
)


# -- aider ----------------------------------------------------------------------------------


def _editable_files(workdir: Path) -> list[str]:
    """The workdir's regular files (no dot-folders, no symlinks, not too large), in path
    order, at most `AIDER_MAX_FILES`; relative to the workdir."""
    found: list[str] = []
    pending = [workdir]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode) and not entry.name.startswith("."):
                pending.append(Path(entry.path))
            elif stat.S_ISREG(info.st_mode) and info.st_size <= AIDER_MAX_FILE_BYTES:
                found.append(str(Path(entry.path).relative_to(workdir)))
    return sorted(found)[:AIDER_MAX_FILES]


def _aider_argv(call: AgentCall) -> tuple[str, ...]:
    files = tuple(f"--file={name}" for name in _editable_files(call.workdir))
    return (
        call.executable,
        "--message-file",
        str(call.prompt_file),
        "--yes-always",
        "--no-git",
        "--no-pretty",
        "--no-stream",
        "--no-check-update",
        "--no-show-model-warnings",
        "--no-suggest-shell-commands",
        "--no-detect-urls",
        "--no-analytics",
        *files,
    )


_SIZE = r"(\d+(?:\.\d+)?k?)"
_AIDER_TOKENS = re.compile(
    rf"Tokens: {_SIZE} sent(?:, {_SIZE} cache write)?(?:, {_SIZE} cache hit)?, {_SIZE} received"
)
_AIDER_COST = re.compile(r"Cost: \$(\d+(?:\.\d+)?) message, \$(\d+(?:\.\d+)?) session")
_AIDER_MODEL = re.compile(r"^(?:Main )?[Mm]odel: (\S+)", re.MULTILINE)


def _aider_count(text: str | None) -> int | None:
    if text is None:
        return None
    return round(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def _aider_usage(stdout: bytes) -> dict[str, Any] | None:
    text = stdout.decode("utf-8", "replace")
    lines = [match.groups() for match in _AIDER_TOKENS.finditer(text)]
    costs = _AIDER_COST.findall(text)
    if not lines and not costs:
        return None
    model = _AIDER_MODEL.search(text)
    return usage_document(
        _total([_aider_count(line[0]) for line in lines]),
        _total([_aider_count(line[3]) for line in lines]),
        cached_input_tokens=_total([_aider_count(line[2]) for line in lines]),
        cost_usd=float(costs[-1][1]) if costs else None,
        model=model.group(1) if model else None,
    )


def _aider_summary(stdout: bytes) -> str:
    lines = stdout.decode("utf-8", "replace").splitlines()
    applied = [line for line in lines if line.startswith("Applied edit to ")]
    return one_line(applied[-1]) if applied else ""


AIDER = AgentPreset(
    name="aider",
    program="aider",
    argv=_aider_argv,
    usage=_aider_usage,
    summary=_aider_summary,
    interface=(
        "aider --message-file PROMPT.md --yes-always --no-git --no-pretty --no-stream "
        "--no-check-update --no-show-model-warnings --no-suggest-shell-commands "
        "--no-detect-urls --no-analytics --file=F... (the workdir's files); stdout is text "
        "with 'Tokens: 2.3k sent, 1.2k cache hit, 150 received.' and 'Cost: $0.01 message, "
        "$0.02 session.' lines (counts rounded to hundreds by aider) and 'Model: NAME ...'."
    ),
)


# -- OpenCode -------------------------------------------------------------------------------


def _opencode_argv(call: AgentCall) -> tuple[str, ...]:
    return (call.executable, "run", "--format", "json", call.prompt_text)


def _opencode_usage(stdout: bytes) -> dict[str, Any] | None:
    steps = [field_of(e, "part") for e in json_objects(stdout) if e.get("type") == "step_finish"]
    if not steps:
        return None
    tokens = [field_of(step, "tokens") for step in steps]
    read = _total([count(field_of(t, "cache", "read")) for t in tokens])
    return usage_document(
        _total(
            [count(field_of(t, "input")) for t in tokens]
            + [read, _total([count(field_of(t, "cache", "write")) for t in tokens])]
        ),
        _total([count(field_of(t, key)) for t in tokens for key in ("output", "reasoning")]),
        cached_input_tokens=read,
        cost_usd=_sum_costs([field_of(step, "cost") for step in steps]),
    )


def _sum_costs(values: list[object]) -> float | None:
    known = [cost(v) for v in values]
    return None if any(v is None for v in known) else sum(v for v in known if v is not None)


def _opencode_summary(stdout: bytes) -> str:
    texts = [field_of(e, "part", "text") for e in json_objects(stdout) if e.get("type") == "text"]
    return one_line(texts[-1]) if texts else ""


OPENCODE = AgentPreset(
    name="opencode",
    program="opencode",
    argv=_opencode_argv,
    usage=_opencode_usage,
    summary=_opencode_summary,
    interface=(
        "opencode run --format json PROMPT; stdout is JSONL events: "
        '{"type": "step_finish", "part": {"cost", "tokens": {input, output, reasoning, '
        'cache: {read, write}}}} (summed), {"type": "text", "part": {"text"}}; opencode has '
        "no flag confining edits: evolane's sandbox does (--isolation confined)."
    ),
)

BUILTIN_AGENTS: dict[str, AgentPreset] = {
    preset.name: preset for preset in (CLAUDE_CODE, CODEX, GEMINI_CLI, AIDER, OPENCODE)
}
"""The presets evolane ships, by name (entry points of ``evolane.agents`` add to them)."""
