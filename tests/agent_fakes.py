"""Fake coding-agent CLIs for the agent presets' tests: one stdlib-only Python script,
installed under each CLI's name, that behaves like the real CLI's documented
non-interactive interface: it parses the flags the preset passes (an unknown or missing
one exits 2, as argparse does), edits ``NOTES.md`` in its working directory from the
prompt, and prints the documented output with usage and cost. It writes nothing outside
its working directory, so a confined run can use it too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FAKE_NAMES = ("claude", "codex", "gemini", "aider", "opencode")
"""The executables the fakes are installed as."""

CLAUDE_COST = 0.0123
"""What the fake ``claude`` reports as ``total_cost_usd``."""
OPENCODE_COSTS = (0.002, 0.003)
"""What the fake ``opencode`` reports per step."""
AIDER_SESSION_COST = 0.02

_SCRIPT = r'''
import argparse
import json
import os
import sys
from pathlib import Path

NAME = os.path.basename(sys.argv[0])


def edit(prompt):
    """Append the prompt's iteration line to NOTES.md in the working directory."""
    line = next((l for l in prompt.splitlines() if l.startswith("Iteration")), "no iteration")
    with open("NOTES.md", "a", encoding="utf-8") as notes:
        notes.write(f"{NAME}: {line}\n")
    if "FAKE_FAIL" in prompt:
        sys.exit(5)


def check_cwd_is(path):
    if os.path.realpath(path) != os.path.realpath(os.getcwd()):
        sys.exit(f"{NAME}: cwd {os.getcwd()} is not {path}")


def claude(argv):
    parser = argparse.ArgumentParser(prog="claude")
    parser.add_argument("prompt")
    parser.add_argument("-p", "--print", action="store_true", required=True)
    parser.add_argument("--output-format", choices=["text", "json", "stream-json"], required=True)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--max-turns", type=int, required=True)
    parser.add_argument("--permission-mode", choices=["default", "acceptEdits", "plan",
                        "bypassPermissions"], required=True)
    parser.add_argument("--allowedTools", required=True)
    parser.add_argument("--add-dir", nargs="+", default=[])
    args = parser.parse_args(argv)
    if args.output_format == "stream-json" and not args.verbose:
        sys.exit("Error: When using --print, --output-format=stream-json requires --verbose")
    for folder in args.add_dir:
        if not os.path.isdir(folder):
            sys.exit(f"--add-dir {folder}: not a directory")
    edit(args.prompt)
    result = {
        "type": "result", "subtype": "success", "is_error": False, "num_turns": 2,
        "result": "Added a note to NOTES.md\nand nothing else", "session_id": "s-1",
        "total_cost_usd": 0.0123,
        "usage": {"input_tokens": 100, "cache_creation_input_tokens": 20,
                  "cache_read_input_tokens": 300, "output_tokens": 50},
        "modelUsage": {"claude-sonnet-4-5": {"costUSD": 0.0123}},
    }
    events = [
        {"type": "system", "subtype": "init", "model": "claude-sonnet-4-5", "cwd": os.getcwd()},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "editing"}]}},
        result,
    ]
    if args.output_format == "json":
        print(json.dumps(result))
    else:
        for event in events:
            print(json.dumps(event), flush=True)


def codex(argv):
    parser = argparse.ArgumentParser(prog="codex")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("exec")
    run.add_argument("prompt")
    run.add_argument("--json", action="store_true", required=True)
    run.add_argument("--sandbox", choices=["read-only", "workspace-write", "danger-full-access"],
                     required=True)
    run.add_argument("--skip-git-repo-check", action="store_true", required=True)
    run.add_argument("--cd", "-C", required=True)
    args = parser.parse_args(argv)
    check_cwd_is(args.cd)
    edit(args.prompt)
    for event in (
        {"type": "thread.started", "thread_id": "t-1"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "i0", "type": "reasoning", "text": "think"}},
        {"type": "item.completed", "item": {"id": "i1", "type": "agent_message",
                                            "text": "Noted the iteration in NOTES.md"}},
        {"type": "turn.completed", "usage": {"input_tokens": 1000, "cached_input_tokens": 400,
                                             "output_tokens": 200}},
    ):
        print(json.dumps(event), flush=True)


def gemini(argv):
    parser = argparse.ArgumentParser(prog="gemini")
    parser.add_argument("-p", "--prompt", required=True)
    parser.add_argument("--output-format", "-o", choices=["text", "json", "stream-json"],
                        required=True)
    parser.add_argument("--approval-mode", choices=["default", "auto_edit", "yolo"],
                        required=True)
    parser.add_argument("--include-directories", action="append", default=[])
    args = parser.parse_args(argv)
    edit(args.prompt)
    stats = {"models": {
        "gemini-2.5-pro": {"api": {"totalRequests": 2},
                           "tokens": {"prompt": 900, "candidates": 80, "total": 1010,
                                      "cached": 500, "thoughts": 30, "tool": 0}},
        "gemini-2.5-flash": {"api": {"totalRequests": 1},
                             "tokens": {"prompt": 100, "candidates": 10, "total": 110,
                                        "cached": 0, "thoughts": 0, "tool": 0}},
    }, "tools": {"totalCalls": 1}}
    print(json.dumps({"response": "Wrote NOTES.md", "stats": stats}, indent=2))


def aider(argv):
    parser = argparse.ArgumentParser(prog="aider")
    parser.add_argument("--message-file", "-f", required=True)
    for flag in ("--yes-always", "--no-git", "--no-pretty", "--no-stream", "--no-check-update",
                 "--no-show-model-warnings", "--no-suggest-shell-commands", "--no-detect-urls",
                 "--no-analytics"):
        parser.add_argument(flag, action="store_true", required=True)
    parser.add_argument("--file", action="append", default=[])
    args = parser.parse_args(argv)
    for name in args.file:
        if not os.path.isfile(name):
            sys.exit(f"aider: --file {name}: not a file")
    prompt = Path(args.message_file).read_text(encoding="utf-8")
    print("Aider v0.86.1")
    print("Model: gpt-4.1 with diff edit format")
    print("Git repo: none")
    edit(prompt)
    print("Applied edit to NOTES.md")
    print("Tokens: 2.3k sent, 1.2k cache hit, 150 received. Cost: $0.01 message, $0.01 session.")
    print("Tokens: 1.5k sent, 50 received. Cost: $0.01 message, $0.02 session.")


def opencode(argv):
    parser = argparse.ArgumentParser(prog="opencode")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("message", nargs="+")
    run.add_argument("--format", choices=["default", "json"], required=True)
    args = parser.parse_args(argv)
    edit(" ".join(args.message))
    steps = [(0.002, {"input": 500, "output": 40, "reasoning": 10,
                      "cache": {"read": 100, "write": 50}}),
             (0.003, {"input": 300, "output": 20, "reasoning": 0,
                      "cache": {"read": 200, "write": 0}})]
    for cost, tokens in steps:
        print(json.dumps({"type": "step_start", "part": {"type": "step-start"}}), flush=True)
        print(json.dumps({"type": "text", "part": {"type": "text", "text": "Updated NOTES.md"}}))
        print(json.dumps({"type": "step_finish", "part": {"type": "step-finish",
                          "reason": "stop", "cost": cost, "tokens": tokens}}), flush=True)


{"claude": claude, "codex": codex, "gemini": gemini, "aider": aider, "opencode": opencode}[
    NAME
](sys.argv[1:])
'''


def install_fakes(bin_dir: Path, names: tuple[str, ...] = FAKE_NAMES) -> Path:
    """Write the fake CLIs ``names`` into ``bin_dir`` (created) and return it. The shebang is
    the real interpreter's path (not a venv link), so a confined run can start it too."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    interpreter = os.path.realpath(sys.executable)
    for name in names:
        path = bin_dir / name
        path.write_text(f"#!{interpreter}\n{_SCRIPT}")
        path.chmod(0o755)
    return bin_dir


def path_with(bin_dir: Path) -> str:
    """PATH with ``bin_dir`` first."""
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
