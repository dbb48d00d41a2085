"""Found by review: a replay template may run a program the candidate carries
(``{candidate}/run.sh``). A candidate that dropped its executable bit, or broke its ``#!``
line (under ``--isolation process``), made every replay a ``spawn_failed`` infrastructure
failure: the measurement stopped as a shared failure and the candidate was ``indecisive``,
never rejected, the host blamed for the candidate's edit (a confined run rejected the same
broken ``#!`` line: bwrap's exec failed inside the sandbox). It is now the candidate's
failure (``program_unrunnable``): its cases score 0 and it is rejected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from evolane.lanes._program import tree_program_fault, unrunnable

RUN_SH = '#!/bin/sh\nprintf \'"yes"\' > "$1/output.json"\n'
EDITS = {
    "noexec": "chmod -x run.sh; echo drop the executable bit",
    "shebang": "sed -i 1s,.*,#!/nonexistent/sh, run.sh; echo break the interpreter line",
    "crlf": 'sed -i "s/\\$/\\r/" run.sh; echo save it with CRLF line ends',
    # An ELF binary linked for a loader the host lacks (a musl build, another distro's): the
    # exec fails ENOENT though the file is there (found by review: the host was blamed, the
    # run failed, and failed again on every --resume-campaign of the journaled proposal).
    "loader": "cp /bin/true run.sh; sed -i s,/ld-,/lX-, run.sh; echo link it for no loader",
    # A script as interpreter whose own #! line names a missing one (ENOENT), as a file an
    # earlier replay left in the shared /var/tmp could be (found by review: the host was
    # blamed, the run failed, and failed again on every resume).
    "nested": "sed -i 1s,.*,#!ROOT/interp, run.sh; echo name a script that cannot run",
}


def _campaign(root: Path, edit: str, isolation: str) -> tuple[dict, str]:
    """A seed whose own ``run.sh`` passes 10 val cases; the optimizer's one edit breaks it."""
    target = root / "target"
    target.mkdir()
    (target / "run.sh").write_text(RUN_SH)
    (target / "run.sh").chmod(0o755)
    (root / "interp").write_text("#!/nonexistent/sh\n")
    (root / "interp").chmod(0o755)
    splits = ["val"] * 10 + ["train"] * 2
    rows = [
        {"id": f"{split[0]}{i}", "input": {}, "expected_output": "yes", "split": split}
        for i, split in enumerate(splits)
    ]
    (root / "cases.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = subprocess.run(
        [
            sys.executable, "-m", "evolane", "optimize",
            "--target", str(target), "--dataset", str(root / "cases.jsonl"),
            "--store", str(root / "store"),
            "--replay", "{candidate}/run.sh {output_dir}",
            "--optimizer", f"sh -c '{EDITS[edit].replace('ROOT', str(root))}'",
            "--iterations", "1", "--population", "1", "--replay-concurrency", "2",
            "--isolation", isolation, "--progress", "none",
        ],
        capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip
    reports = list((root / "store").glob("runs/*/report.json"))
    assert len(reports) == 1, done.stdout + done.stderr  # a run with no report says why
    return json.loads(reports[0].read_text()), done.stdout + done.stderr


@pytest.mark.parametrize(
    ("edit", "isolation"),
    [
        ("noexec", "process"),
        ("noexec", "auto"),
        ("shebang", "process"),
        ("crlf", "process"),
        ("loader", "process"),
        ("nested", "process"),
    ],
)
def test_a_candidate_that_breaks_its_own_replay_program_is_rejected(
    tmp_path: Path, edit: str, isolation: str
) -> None:
    report, output = _campaign(tmp_path, edit, isolation)
    assert report["status"] == "finished", output
    assert [d["decision"] for d in report["decisions"]] == ["reject"], output
    failures = [entry["failure"] for entry in report["failures"]]
    assert failures, output
    assert all(f["owner"] == "candidate" for f in failures), failures
    assert not any(f["code"] == "spawn_failed" for f in failures), failures


def test_an_elf_file_naming_a_missing_loader_is_broken(tmp_path: Path) -> None:
    true = Path("/bin/true").read_bytes()
    if not true.startswith(b"\x7fELF") or b"/ld-" not in true:
        pytest.skip("no dynamically linked /bin/true here")
    assert unrunnable(_script(tmp_path / "true", true)) is None
    broken = _script(tmp_path / "broken", true.replace(b"/ld-", b"/lX-", 1))
    assert "ELF interpreter" in (unrunnable(broken) or "")
    assert unrunnable(_script(tmp_path / "short", b"\x7fELF")) is None  # no headers: no say
    loader = next(word for word in true.split(b"\0") if b"/ld-" in word)
    relative = true.replace(loader, loader[1:] + b"\0", 1)  # looked for in the working folder
    assert "not an absolute path" in (unrunnable(_script(tmp_path / "rel", relative)) or "")
    # A loader of another machine's (ELIBBAD), at a path short enough to patch in.
    handle, name = tempfile.mkstemp(dir="/tmp", prefix="e")
    os.close(handle)
    try:
        _script(Path(name), true[:18] + b"\xb7\x00" + true[20:])  # aarch64's
        other = true.replace(loader, os.fsencode(name).ljust(len(loader), b"\0"), 1)
        assert "another machine" in (unrunnable(_script(tmp_path / "o", other)) or "")
    finally:
        os.unlink(name)


def _script(path: Path, text: bytes, mode: int = 0o755) -> Path:
    """``path`` written with ``text`` and given ``mode``."""
    path.write_bytes(text)
    path.chmod(mode)
    return path


def test_what_a_broken_program_is(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    assert unrunnable(_script(tree / "good.sh", b"#!/bin/sh\ntrue\n")) is None
    assert unrunnable(tree / "missing.sh") is not None
    plain = _script(tree / "plain.sh", b"true\n", 0o644)
    assert "not executable" in (unrunnable(plain) or "")
    plain.chmod(0o755)
    assert unrunnable(plain) is None  # no "#!": run by sh, as execvp would
    bad = _script(tree / "bad.sh", b"#!/nonexistent/sh -e\ntrue\n")
    assert "interpreter" in (unrunnable(bad) or "")
    # Only a program inside the tree under test is the tree's doing.
    assert tree_program_fault((str(bad), "x"), tree) is not None
    assert tree_program_fault((str(bad), "x"), tmp_path / "other") is None
    assert tree_program_fault(("sh", str(bad)), tree) is None
    assert tree_program_fault((f"{tree}/../tree2/x",), tree) is None


def test_a_script_interpreter_is_checked_as_the_kernel_follows_it(tmp_path: Path) -> None:
    # An interpreter that is a script runs by its own #! line, up to 5 such files deep.
    broken = _script(tmp_path / "broken", b"#!/nonexistent/sh\n")
    assert "/nonexistent/sh" in (
        unrunnable(_script(tmp_path / "a", b"#!%s\n" % bytes(broken))) or ""
    )
    previous = Path("/bin/sh")
    for level in range(1, 7):
        previous = _script(tmp_path / f"s{level}", b"#!%s\ntrue\n" % bytes(previous))
        fault = unrunnable(previous)
        assert (fault is None) == (level <= 5), (level, fault)
    loop = tmp_path / "loop"
    _script(loop, b"#!%s\n" % bytes(loop))
    assert "deeper" in (unrunnable(loop) or "")


def test_a_hash_bang_line_is_read_as_the_kernel_reads_it(tmp_path: Path) -> None:
    # Found by review: a run.sh saved with CRLF line ends names "/bin/sh\r", which the
    # exec cannot find (ENOENT, a spawn_failed), while bytes.split() read "/bin/sh": the
    # candidate's own breakage stayed the host's, indecisive. The kernel ends a word at a
    # space, a tab or a NUL only.
    for line in (b"#!/bin/sh\r\n", b"#!/bin/sh\x0b\n", b"#!/bin/sh\x0c -e\n"):
        script = _script(tmp_path / "run.sh", line + b"true\n")
        assert "interpreter" in (unrunnable(script) or ""), line
    for line in (b"#!/bin/sh\n", b"#! \t/bin/sh -e\n", b"#!/bin/sh\t-e\r\n"):
        assert unrunnable(_script(tmp_path / "run.sh", line + b"true\n")) is None, line


def test_the_program_checked_is_the_one_the_exec_looks_for(tmp_path: Path) -> None:
    # Found by review: "{candidate}/bin/../run.sh" was checked as normpath names it,
    # "{candidate}/run.sh", while the exec goes through bin/ (gone, or a symlink): a
    # candidate that removed bin/ broke its replay and the host was blamed.
    tree = tmp_path / "tree"
    tree.mkdir()
    _script(tree / "run.sh", b"#!/bin/sh\ntrue\n")
    assert tree_program_fault((f"{tree}/bin/../run.sh",), tree) is not None  # no bin/
    (tree / "bin").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert tree_program_fault((f"{tree}/bin/../run.sh",), tree) is not None
    (tree / "bin").unlink()
    (tree / "bin").mkdir()
    assert tree_program_fault((f"{tree}/bin/../run.sh",), tree) is None
