"""Issue 17, items 4 and 7, attacked through ``evolane optimize`` as real hostile commands: an
optimizer that leaves a 1,500-deep folder chain, 20,000 small files or a 150 MB sparse file;
a replay whose answer is 150 MB; a judge that prints 1 MB before its JSON score.

Each test asserts the promise (the candidate is refused by the cap that names it, nothing of
it reaches the store, memory stays bounded, the score is read), not only that nothing crashed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evolane.store import read_journal, remove_tree
from tests.campaign_helpers import toy_flags, write_toy


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path: Path) -> Iterator[None]:
    """These tests leave trees deeper than the recursion limit: pytest's own clean-up of old
    temporary folders (shutil.rmtree) would crash on them in a later session."""
    yield
    remove_tree(tmp_path)


EVOLANE = [sys.executable, "-m", "evolane"]


def _optimize(
    root: Path, flags: list[str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, "optimize", *flags], capture_output=True, text=True, cwd=root, timeout=timeout
    )


def _peak_rss(root: Path, flags: list[str], timeout: float = 600) -> tuple[int, str, str, int]:
    """Run ``evolane optimize`` under a fresh wrapper process and return (exit code, stdout,
    stderr, peak RSS in bytes of evolane or any process it reaped: ``wait4``)."""
    wrapper = textwrap.dedent(
        """
        import os, subprocess, sys, json
        child = subprocess.Popen(sys.argv[1:], stdout=open("out.txt", "w"),
                                 stderr=open("err.txt", "w"))
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        print(json.dumps({"rc": child.returncode, "maxrss_kib": usage.ru_maxrss}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, *EVOLANE, "optimize", *flags],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=timeout,
        check=True,
    )
    result = json.loads(done.stdout)
    out, err = (root / "out.txt").read_text(), (root / "err.txt").read_text()
    return result["rc"], out, err, result["maxrss_kib"] * 1024


def _flags(paths: dict[str, Path], store: Path, optimizer: str, **extra: str) -> list[str]:
    flags = toy_flags(paths, store)
    flags[flags.index("--optimizer") + 1] = optimizer
    flags[flags.index("--iterations") + 1] = "1"
    flags[flags.index("--population") + 1] = "1"
    for name, value in extra.items():
        flag = "--" + name.replace("_", "-")
        if flag in flags:
            flags[flags.index(flag) + 1] = value
        else:
            flags += [flag, value]
    return flags


def _hostile_optimizer(root: Path, body: str) -> str:
    script = root / "hostile_optimizer.py"
    script.write_text("import os, sys\nworkdir = sys.argv[1]\n" + textwrap.dedent(body))
    return f"{sys.executable} -I {script} {{workdir}}"


def _proposals(store: Path) -> list[dict[str, Any]]:
    (journal,) = store.glob("runs/*/journal.jsonl")
    records = read_journal(journal).records
    return [record["result"] for record in records if record.get("type") == "proposal"]


def _stored_bytes(store: Path) -> int:
    objects = store / "objects"
    return sum(p.stat().st_size for p in objects.rglob("*") if p.is_file())


DEEP_CHAIN = """
os.chdir(workdir)
for _ in range(1500):
    os.mkdir("d")
    os.chdir("d")
open("leaf.txt", "w").write("deep")
print("deep chain")
"""


def test_a_1500_deep_folder_chain_is_refused_by_its_cap_and_the_store_keeps_working(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {})
    store = tmp_path / "store"
    flags = _flags(paths, store, _hostile_optimizer(tmp_path, DEEP_CHAIN))
    first = _optimize(tmp_path, flags)
    assert first.returncode == 0, first.stderr
    assert "RecursionError" not in first.stderr + first.stdout
    (proposal,) = _proposals(store)
    assert proposal["status"] == "rejected" and proposal["gate"]["gate"] == "size_limit"
    assert "max_depth" in proposal["gate"]["reason"]
    # A later run in the same store starts, sweeps and finishes.
    second = _optimize(tmp_path, flags)
    assert second.returncode == 0, second.stderr
    assert not list((store / "sandbox").glob("rt-*"))  # every lease removed, deep or not


def test_a_store_left_with_a_deep_tree_by_a_dead_run_does_not_break_the_next(
    tmp_path: Path,
) -> None:
    """What the attack left before this fix: a dead runtime's lease holding a 1,500-deep
    chain (shutil.rmtree raised RecursionError in the sweep, so every later run exited 1)."""
    paths = write_toy(tmp_path, {"default": "fix:2"})
    store = tmp_path / "store"
    stale = store / "sandbox" / "rt-1-deadbeef"
    (stale / "optimizer" / "slot").mkdir(parents=True)
    (stale / "owner.json").write_text(json.dumps({"pid": 1, "create_time": -1.0}))
    here = os.getcwd()
    try:
        os.chdir(stale / "optimizer" / "slot")
        for _ in range(1500):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    flags = toy_flags(paths, store)  # the toy's own, well-behaved optimizer
    flags[flags.index("--iterations") + 1] = "1"
    done = _optimize(tmp_path, flags)
    assert done.returncode == 0, done.stderr
    assert not stale.exists()


def test_20000_small_files_are_refused_while_walking_before_any_is_stored(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {})
    store = tmp_path / "store"
    body = """
    for index in range(20_000):
        with open(os.path.join(workdir, f"f{index:05d}.txt"), "w") as out:
            out.write(f"file {index}")
    print("many files")
    """
    done = _optimize(tmp_path, _flags(paths, store, _hostile_optimizer(tmp_path, body)))
    assert done.returncode == 0, done.stderr
    (proposal,) = _proposals(store)
    assert proposal["status"] == "rejected" and proposal["gate"]["gate"] == "size_limit"
    assert "max_files" in proposal["gate"]["reason"]
    blobs = [p for p in (store / "objects" / "sha256").rglob("*") if p.is_file()]
    assert len(blobs) < 500  # the run's own records, none of the 20,000 files


def test_a_150_mb_sparse_file_is_refused_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {})
    store = tmp_path / "store"
    body = """
    with open(os.path.join(workdir, "huge.bin"), "wb") as out:
        out.truncate(150_000_000)
    print("sparse")
    """
    done = _optimize(tmp_path, _flags(paths, store, _hostile_optimizer(tmp_path, body)))
    assert done.returncode == 0, done.stderr
    (proposal,) = _proposals(store)
    assert proposal["status"] == "rejected" and proposal["gate"]["gate"] == "size_limit"
    assert "max_bytes" in proposal["gate"]["reason"] and "huge.bin" in proposal["gate"]["reason"]
    assert _stored_bytes(store) < 5_000_000  # never hashed into a 150 MB blob


def test_a_150_mb_answer_is_judged_by_exact_match_in_bounded_memory(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {})
    store = tmp_path / "store"
    replay = tmp_path / "replay.sh"
    replay.write_text(
        'if [ "$EVOLANE_CASE_ID" = val00 ]; then\n'
        "  { printf '\"'; head -c 150000000 /dev/zero | tr '\\0' y; printf '\"'; }"
        ' > "$2/output.json"\n'
        'else cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"; fi\n'
    )
    flags = _flags(paths, store, _hostile_optimizer(tmp_path, "print('noop')\n"))
    flags[flags.index("--replay") + 1] = f"sh {replay} {{candidate}} {{output_dir}}"
    code, _out, err, peak = _peak_rss(tmp_path, flags)
    assert code == 0, err
    assert peak < 200 << 20, f"peak RSS {peak / 2**20:.0f} MiB"  # memory, not time
    (journal,) = store.glob("runs/*/journal.jsonl")
    units = [r for r in read_journal(journal).records if r.get("type") == "unit"]
    judged = [u["judge"] for u in units if u["replay"]["case_id"] == "val00"]
    assert judged and all(j["status"] == "succeeded" and j["score"] == 0.0 for j in judged)
    detail = (store / "objects" / "sha256").rglob(judged[0]["detail_ref"]["digest"][7:])
    (detail_file,) = list(detail)
    assert "MAX_ANSWER_BYTES" in detail_file.read_text()  # says why: over the cap, unread


def test_a_judge_that_prints_1_mb_before_its_json_last_line_is_scored(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {})
    store = tmp_path / "store"
    judge = tmp_path / "judge.py"
    judge.write_text(
        textwrap.dedent(
            """
            import json, sys
            case = json.load(open(sys.argv[1]))
            answer = json.load(open(sys.argv[2] + "/output.json"))
            sys.stdout.write(("noise " * 100 + "\\n") * 1750)  # about 1 MB
            print(json.dumps({"score": 1.0 if answer == case["expected_output"] else 0.0}))
            """
        )
    )
    flags = _flags(paths, store, _hostile_optimizer(tmp_path, "print('noop')\n"))
    flags += ["--judge", f"{sys.executable} -I {judge} {{case_file}} {{output_dir}}"]
    done = _optimize(tmp_path, flags)
    assert done.returncode == 0, done.stderr
    (journal,) = store.glob("runs/*/journal.jsonl")
    units = [r for r in read_journal(journal).records if r.get("type") == "unit"]
    scores = {u["replay"]["case_id"]: u["judge"]["score"] for u in units if u.get("judge")}
    assert scores and all(u["judge"]["status"] == "succeeded" for u in units)
    assert scores["val00"] == 1.0 and scores["val11"] == 0.0  # the seed passes val00-val03
