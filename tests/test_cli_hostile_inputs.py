"""Hostile inputs at the door (found by review): each is one error line naming the input and
exit code 2, never an internal error, a traceback or a hang, and nothing is written."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, with_flag, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
PLAN = {"0.0": "fix:1", "0.1": "noop"}

Case = Callable[[Path, list[str]], tuple[list[str], str]]
"""(folder, base flags) -> (estimate flags, what the error line must say: parts split by |)."""


def _tree(folder: Path, name: str, make: Callable[[Path], object]) -> Path:
    root = folder / name
    root.mkdir()
    (root / "greetings.txt").write_text("hello\n")
    make(root)
    return root


def _target_with(name: str, make: Callable[[Path], object], needle: str) -> Case:
    def case(folder: Path, base: list[str]) -> tuple[list[str], str]:
        root = _tree(folder, name, make)
        return with_flag(base, "--target", str(root)), f"--target {root}: |{needle}"

    return case


def _bind(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()


def _deep(root: Path) -> None:
    os.makedirs(root / "/".join(["d"] * 65))


def _fifo_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    return with_flag(base, "--target", str(fifo)), f"--target {fifo}: not a regular file"


def _file(name: str, text: str, flag: str, needle: str) -> Case:
    def case(folder: Path, base: list[str]) -> tuple[list[str], str]:
        path = folder / name
        path.write_text(text)
        return with_flag(base, flag, str(path)), needle.format(path=path)

    return case


def _prices_fifo(folder: Path, base: list[str]) -> tuple[list[str], str]:
    fifo = folder / "prices.yaml"
    os.mkfifo(fifo)
    return with_flag(base, "--prices", str(fifo)), f"--prices {fifo}: not a regular file"


def _dataset_fifo(folder: Path, base: list[str]) -> tuple[list[str], str]:
    fifo = folder / "cases.jsonl"
    os.mkfifo(fifo)
    return with_flag(base, "--dataset", str(fifo)), f"--dataset {fifo}: a FIFO, not a regular"


def _dataset_folder(folder: Path, base: list[str]) -> tuple[list[str], str]:
    cases = folder / "cases"
    cases.mkdir()
    return with_flag(base, "--dataset", str(cases)), f"--dataset {cases}: a directory, not a"


def _empty_trajectory(folder: Path, base: list[str]) -> tuple[list[str], str]:
    path = folder / "t_empty.jsonl"
    path.write_text("")
    args = with_flag(with_flag(base, "--dataset", ""), "--from-trajectory", str(path))
    return args, f"--from-trajectory {path}: no trajectory records"


def _dataset_in_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """Found by review: the optimizer's workdir and every replay's candidate are copies of
    the target, so a dataset inside it showed them every split's expected outputs."""
    inside = folder / "target" / "evals" / "cases.jsonl"
    inside.parent.mkdir()
    inside.write_text((folder / "dataset.jsonl").read_text())
    args = with_flag(base, "--dataset", str(inside))
    return args, f"--dataset {inside} is inside --target {folder / 'target'}"


def _trajectory_in_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    traces = folder / "target" / "traces"
    traces.mkdir()
    (traces / "t.jsonl").write_text("")
    args = with_flag(with_flag(base, "--dataset", ""), "--from-trajectory", str(traces))
    return args, f"--from-trajectory {traces} is inside --target"


def _dataset_copy_in_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """A copy of the dataset left in the target once the dataset was moved out of it (what
    the refusal above asks for): every candidate could read the val and test answers."""
    copy = folder / "target" / "evals" / "cases.jsonl"
    copy.parent.mkdir()
    copy.write_text((folder / "dataset.jsonl").read_text())
    return base, "evals/cases.jsonl:1 holds val case 'val00'|(and 17 more val/test cases)"


def _val_row_pasted_in_prompt(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """One val case as a few-shot example in a prompt, its keys reordered and respaced."""
    prompt = folder / "target" / "prompt.md"
    row = '  {"expected_output" : "yes", "note": "example", "input": {"n": "val07"}}'
    prompt.write_text(f"# Examples\n\n{row}\n")
    return base, "prompt.md:3 holds val case 'val07': its input and expected output;"


def _test_rows_as_one_document(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """Test cases pretty-printed as a JSON document (no line of it is a row)."""
    rows = [{"input": {"n": f"test{n:02d}"}, "expected_output": "yes"} for n in (4, 5)]
    (folder / "target" / "fixtures.json").write_text(json.dumps({"cases": rows}, indent=2))
    return base, "fixtures.json holds test case 'test04'|(and 1 more val/test case)"


_TRACES = "".join(
    f'{{"messages": [{{"role": "user", "content": "q{n}"}}, '
    f'{{"role": "assistant", "content": "a{n}"}}]}}\n'
    for n in range(40)
)


def _trajectory_folder_around_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """Found by review: the walk of a folder that holds the target read its ``.jsonl``."""
    target = folder / "agent" / "skill"
    shutil.copytree(folder / "target", target)
    inside = target / "t.jsonl"
    inside.write_text(_TRACES)
    args = with_flag(with_flag(base, "--dataset", ""), "--from-trajectory", str(folder / "agent"))
    return with_flag(args, "--target", str(target)), f"--from-trajectory {inside} is inside"


def _trajectory_symlinked_into_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """Found by review: a folder elsewhere read a symlinked file that lies in the target."""
    (folder / "target" / "t.jsonl").write_text(_TRACES)
    logs = folder / "logs"
    logs.mkdir()
    (logs / "t.jsonl").symlink_to(folder / "target" / "t.jsonl")
    args = with_flag(with_flag(base, "--dataset", ""), "--from-trajectory", str(logs))
    return args, f"--from-trajectory {logs / 't.jsonl'} is inside --target"


def _value(flag: str, value: str, needle: str) -> Case:
    return lambda folder, base: (with_flag(base, flag, value), needle)


DIGITS = "9" * 5000


def _trajectory_copy_in_target(folder: Path, base: list[str]) -> tuple[list[str], str]:
    """A copy of the trajectory file, under another name, in the target."""
    traces, text = folder / "traces.jsonl", _TRACES * 10  # enough cases for the gate
    traces.write_text(text)
    (folder / "target" / "history.log").write_text(text)
    args = with_flag(with_flag(base, "--dataset", ""), "--from-trajectory", str(traces))
    return args, f"history.log is a copy of --from-trajectory {traces}"


CASES: dict[str, Case] = {
    "symlink-absolute": _target_with(
        "linkout",
        lambda root: (root / "shadow").symlink_to("/etc/shadow"),
        "symlink 'shadow' points outside the tree (/etc/shadow)",
    ),
    "symlink-root": _target_with(
        "linkdir", lambda root: (root / "root").symlink_to("/"), "symlink 'root' points outside"
    ),
    "symlink-climbing": _target_with(
        "up", lambda root: (root / "up").symlink_to("../x"), "symlink 'up' points outside"
    ),
    "fifo-inside": _target_with("fifo-in", lambda root: os.mkfifo(root / "f"), "cannot snapshot"),
    "socket-inside": _target_with("sock", lambda root: _bind(root / "s"), "cannot snapshot"),
    "too-deep": _target_with("deep", _deep, "over the cap of 64 (max_depth)"),
    "fifo-target": _fifo_target,
    "dev-null-target": _value("--target", "/dev/null", "--target /dev/null: not a regular file"),
    "store-empty": _value("--store", "", "--store is empty: name the store's folder"),  # "$STORE"
    "max-tokens": _value("--max-tokens", "1000000000000001", "--max-tokens: "),
    "max-cost": _value("--max-cost-usd", "1e300", "--max-cost-usd: "),
    "prices-long-int": _file(
        "p.yaml", f"m: {{input: {DIGITS}, output: 1}}\n", "--prices", "--prices {path}:1: a number"
    ),
    "prices-deep": _file(
        "p.yaml", "[" * 100_000, "--prices", "--prices {path}:1: nested over 32 levels"
    ),
    "prices-duplicate": _file(
        "p.yaml",
        "m: {input: 1, output: 1}\nm: {input: 9, output: 9}\n",
        "--prices",
        "--prices {path}:2: duplicate key 'm'",
    ),
    "prices-fifo": _prices_fifo,
    "config-deep": _file(
        "c.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n", "--config", "nested too deeply"
    ),
    "config-long-int": _file(
        "c.toml", f"iterations = {DIGITS}\n", "--config", "an integer of too many digits"
    ),
    "trajectory-empty": _empty_trajectory,
    "dataset-fifo": _dataset_fifo,
    "dataset-folder": _dataset_folder,
    "dataset-inside-target": _dataset_in_target,
    "trajectory-inside-target": _trajectory_in_target,
    "trajectory-folder-around-target": _trajectory_folder_around_target,
    "trajectory-symlinked-into-target": _trajectory_symlinked_into_target,
    "dataset-copy-in-target": _dataset_copy_in_target,
    "val-row-pasted-in-prompt": _val_row_pasted_in_prompt,
    "test-rows-as-one-document": _test_rows_as_one_document,
    "trajectory-copy-in-target": _trajectory_copy_in_target,
    # found by hostile review: Path.exists raises ENAMETOOLONG, a traceback, exit 1
    "target-name-too-long": _value("--target", "L" * 300, "L" * 300 + ": a file name too long"),
    "store-name-too-long": _value("--store", "L" * 300, "a file name too long"),
    "expose-name-too-long": _value("--expose", "L" * 300, "a file name too long"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_input_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    args, needle = CASES[name](tmp_path, toy_flags(paths, store))
    done = subprocess.run(
        [*EVOLANE, "estimate", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("evolane: error: "), done.stderr
    assert all(part in lines[0] for part in needle.split("|")), lines[0]
    assert "internal error" not in lines[0]
    assert not store.exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-memory", "99999999999999999999999G"),
        ("--max-file-size", "9" * 400),  # past a float: an OverflowError once
        ("--max-procs", "9" * 25),
        ("--max-open-files", "9" * 25),
    ],
)
def test_a_limit_past_64_bits_is_refused_before_the_store(
    tmp_path: Path, flag: str, value: str
) -> None:
    """Found by hostile review: a limit past a signed 64-bit integer passed the flags, then
    `optimize` failed writing run.json (internal error, exit 1), leaving an empty run folder
    and an `active` campaign of no cycle in the store."""
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    args = with_flag(toy_flags(paths, store), flag, value)
    done = subprocess.run(
        [*EVOLANE, "optimize", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines == [
        f"evolane: error: {flag}: over the maximum of {2**63 - 1} (0 or none: no limit)"
    ], done.stderr
    assert not store.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--store", "L" * 300],
        ["fsck", "--store", "L" * 300],
        ["config", "show", "--config", "L" * 300],
        ["dataset", "from-trajectory", "t.jsonl", "-o", "L" * 300],
    ],
    ids=["runs", "fsck", "config-show", "from-trajectory-o"],
)
def test_a_name_too_long_is_one_line_and_exit_2_in_every_command(
    tmp_path: Path, args: list[str]
) -> None:
    """Found by hostile review: a path with a name over 255 bytes failed each command with a
    Python traceback, exit 1 (``Path.exists`` raises ENAMETOOLONG)."""
    (tmp_path / "t.jsonl").write_text(_TRACES)
    done = subprocess.run(
        [*EVOLANE, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("evolane: error: "), done.stderr
    assert "a file name too long for the file system" in lines[0]
