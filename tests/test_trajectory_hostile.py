"""Trajectory ingestion under hostile and awkward inputs (found by review): records whose
``task`` or ``input`` stands for their first message, case ids that the safe form of a
session id or file name makes equal, long chains of follow-ups, inputs that are pipes,
the same file given twice, and runs of blank lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evolane.inputs import DatasetError, ingest_trajectories, load_dataset


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _said(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


def test_a_first_call_logged_with_its_input_is_dealt_with_the_calls_that_log_it(
    tmp_path: Path,
) -> None:
    """API logs without a session id: the first call carries ``input`` (its request) and
    its own messages; the next call logs that exchange. Dealt by the first call's
    ``input`` rather than its message, 12 of 18 val and test answers sat in train inputs."""
    rows = []
    for n in range(30):
        asked, answer = f"question {n}", f"SECRET-{n}-"
        first = [_said("user", asked), _said("assistant", answer)]
        rows.append(
            {"target": "T", "input": {"q": asked}, "messages": first}
            | {"outcome": {"status": "success"}}
        )
        later = [*first, _said("user", f"follow {n}"), _said("assistant", "b")]
        rows.append(
            {"target": "T", "input": {"q": f"follow {n}"}, "messages": later}
            | {"outcome": {"status": "failure"}}
        )
    derived = ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)])
    cases = list(derived.dataset)
    held = {c.expected_output for c in cases if c.split != "train" and c.expected_output}
    shown = " ".join(json.dumps(c.input) for c in cases if c.split == "train")
    assert held and not [answer for answer in held if str(answer) in shown]
    by_conversation: dict[str, set[str]] = {}
    for case in cases:
        by_conversation.setdefault(str(case.metadata["cluster"]), set()).add(case.split)
    assert len(by_conversation) == 30
    assert all(len(splits) == 1 for splits in by_conversation.values())


def test_ids_alike_only_in_their_safe_form_give_distinct_cases(tmp_path: Path) -> None:
    """Case ids are made of safe characters: session ids of other letters, ids alike in
    their first 120 characters and ``traces.jsonl`` of two day folders were refused as one
    case id given twice. Each gets a digest of its full name; an ``id`` given twice is
    still refused."""
    long = "x" * 200
    rows = [
        {"session_id": sid, "turn": 1, "task": f"q {n}", "target": "T"}
        for n, sid in enumerate(["会话1", "客户1", "a b", "a/b", long + "1", long + "2"])
    ]
    _write(tmp_path / "s.jsonl", rows)
    for day in ("mon", "tue"):
        _write(tmp_path / day / "traces.jsonl", [{"task": f"on {day}", "target": "T"}])
    derived = ingest_trajectories([tmp_path])
    ids = [case.id for case in derived.dataset]
    assert len(ids) == 8 == len(set(ids)), ids
    assert sum(1 for i in ids if i.startswith("L1-")) == 2
    again = ingest_trajectories([tmp_path / "tue", tmp_path / "mon", tmp_path / "s.jsonl"])
    assert sorted(c.id for c in again.dataset) == sorted(ids)  # whatever the order given
    twice = [{"id": "same", "task": "a", "target": "T"}, {"id": "same", "task": "b", "target": "T"}]
    with pytest.raises(DatasetError, match=r"t\.jsonl:2: case id 'same' again"):
        ingest_trajectories([_write(tmp_path / "t" / "t.jsonl", twice)])


def test_a_long_chain_of_follow_ups_is_refused_before_every_chain_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each follow-up's case carries its chain, so a long session's cases outgrow a
    dataset: a session of 20,000 tiny follow-ups (2 MB) was refused after a minute, once
    every turn's chain had been built. The refusal comes at the turn that goes over."""
    import evolane.inputs._trajectory as trajectory

    monkeypatch.setattr(trajectory, "MAX_CASES_BYTES", 40_000)
    built = 0
    chain_tail = trajectory.chain_tail

    def counted(turn: Any, budget: int) -> Any:
        nonlocal built
        built += 1
        return chain_tail(turn, budget)

    monkeypatch.setattr(trajectory, "chain_tail", counted)
    rows = [{"session_id": "s", "turn": t, "task": f"and {t}", "target": "T"} for t in range(3000)]
    with pytest.raises(DatasetError, match=r"t\.jsonl:\d+: the cases of group 'T' are over"):
        ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], context_budget=4096)
    assert built < 300, built


def _evolane(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from evolane.cli import main; main()", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=cwd, input=stdin
    )


def test_a_pipe_is_read_and_a_device_is_named_for_what_it_is(tmp_path: Path) -> None:
    """``/dev/stdin`` from a pipe (or ``<(zcat ...)``) was said to be "no such file or
    directory", and so was ``/dev/null``."""
    rows = "".join(json.dumps({"task": f"q{n}", "target": "T"}) + "\n" for n in range(3))
    out = ["-o", "cases.jsonl"]
    done = _evolane("dataset", "from-trajectory", "/dev/stdin", *out, cwd=tmp_path, stdin=rows)
    assert done.returncode == 0, done.stderr
    assert "wrote 3 cases" in done.stdout
    done = _evolane("dataset", "from-trajectory", "/dev/null", "-o", "x.jsonl", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == "evolane: error: /dev/null: not a file, a pipe or a folder\n"


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    """A file given twice, or a folder and a file in it, was read twice: refused as its own
    turns again (and counted twice against the cap on files)."""
    rows = [{"session_id": f"s{n}", "turn": 1, "task": f"q{n}", "target": "T"} for n in range(4)]
    path = _write(tmp_path / "in" / "t.jsonl", rows)
    (tmp_path / "in" / "link.jsonl").symlink_to(path)
    derived = ingest_trajectories([path, tmp_path / "in", tmp_path / "in" / ".." / "in"])
    assert len(derived.dataset) == 4
    assert derived.dataset.by_id("s0-t1").metadata["source"] == f"{path}:1"


def test_runs_of_blank_lines_are_passed_over_in_bulk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 MiB of newlines took 30 s, read one line at a time in Python; a bad line after
    them is still named by its line."""
    import evolane.inputs._dataset as dataset
    import evolane.inputs._trajectory_read as read

    lines = 0
    spans = dataset._line_spans

    def counted(data: bytes, start: int) -> Any:
        nonlocal lines
        for span in spans(data, start):
            lines += 1
            yield span

    monkeypatch.setattr(dataset, "_line_spans", counted)
    monkeypatch.setattr(read, "_line_spans", counted, raising=False)
    record = json.dumps({"task": "q", "target": "T"})
    data = f"\ufeff{record}\n" + "\n \r\n\t\n" * 20_000 + f"  {record}\r\n\n{{bad\n"
    (tmp_path / "t.jsonl").write_text(data)
    with pytest.raises(DatasetError, match=r"t\.jsonl:60004: invalid JSON"):
        read.read_trajectories([tmp_path / "t.jsonl"], max_records=3)
    with pytest.raises(DatasetError, match=r"t\.jsonl:60004: more than 2 trajectory records"):
        read.read_trajectories([tmp_path / "t.jsonl"], max_records=2)
    assert lines < 100, lines


def test_sessions_of_long_ids_alike_in_their_start_are_clusters_of_their_own(
    tmp_path: Path,
) -> None:
    """A cluster name is at most 256 characters: cut alone, 24 sessions whose ids share
    their first 250 characters were one cluster, and the gate counted one observation."""
    rows = [
        {"session_id": "x" * 250 + f"{n:03d}", "turn": 1, "task": f"q{n}", "target": "T"}
        for n in range(24)
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])
    clusters = {str(case.metadata["cluster"]) for case in derived.dataset}
    assert len(clusters) == 24 and max(map(len, clusters)) <= 256


def test_an_image_first_conversation_is_dealt_by_its_image(tmp_path: Path) -> None:
    """A first call whose user message is an image alone (no text) was dealt by its
    ``task``, the later calls that log it by an empty opening, all together: with seed 4,
    12 of 12 val and test answers sat inside train inputs. The image's name is the key."""
    rows = []
    for n in range(30):
        image = {"type": "image_url", "image_url": {"url": f"https://x.test/{n}.png"}}
        first = [{"role": "user", "content": [image]}, _said("assistant", f"SECRET-{n}-")]
        status = "success" if n % 3 else "failure"
        rows.append({"target": "T", "task": f"describe {n}", "messages": first})
        rows[-1]["outcome"] = {"status": status}
        later = [*first, _said("user", f"and the colour? {n}"), _said("assistant", "b")]
        rows.append({"target": "T", "messages": later, "outcome": {"status": "failure"}})
    path = _write(tmp_path / "calls.jsonl", rows)
    for seed in range(6):
        cases = list(ingest_trajectories([path], seed=seed).dataset)
        held = {c.expected_output for c in cases if c.split != "train" and c.expected_output}
        shown = " ".join(json.dumps(c.input) for c in cases if c.split == "train")
        assert held and not [answer for answer in held if str(answer) in shown], seed
        assert len({c.metadata["cluster"] for c in cases}) == 30


def test_a_file_whose_name_is_not_utf8_gives_cases_not_a_traceback(tmp_path: Path) -> None:
    """A file so named in a folder (``\\xff.jsonl``: Latin-1 from an older system) broke
    ingestion with a traceback: its name, in each case's ``source``, could not be written."""
    folder = tmp_path / "in"
    folder.mkdir()
    row = {"task": "q", "outcome": {"status": "failure"}}
    with open(os.path.join(os.fsencode(folder), b"\xff.jsonl"), "wb") as out:
        out.write(json.dumps(row).encode() + b"\n")
    done = _evolane("dataset", "from-trajectory", "in", "-o", "cases.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (case,) = [json.loads(line) for line in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert case["metadata"]["source"] == "in/\\xff.jsonl:1"


def test_cases_written_to_stdout_are_not_mixed_with_the_summary(tmp_path: Path) -> None:
    """``-o /dev/stdout | ...``: the groups and the "wrote" line went into the stream of
    cases, read as bad cases by what read it."""
    _write(tmp_path / "t.jsonl", [{"task": f"q{n}", "target": "T"} for n in range(3)])
    out = ["-o", "/dev/stdout"]
    done = _evolane("dataset", "from-trajectory", "t.jsonl", *out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["metadata"]["group"] for row in rows] == ["T"] * 3
    assert "wrote 3 cases" in done.stderr and "chosen: T" in done.stderr


def test_a_group_of_one_task_given_many_times_is_not_the_largest(tmp_path: Path) -> None:
    """A task given 50 times is one case once its repeats are left out: it was chosen as
    the largest group over 20 distinct tasks, and gave one case."""
    rows = [
        {"session_id": f"cron{n}", "turn": 1, "task": "Check the backups", "target": "cron"}
        | {"outcome": {"status": "failure" if n % 2 else "success"}}
        for n in range(50)
    ]
    rows += [
        {"session_id": f"ask{n}", "turn": 1, "task": f"question {n}", "target": "ask"}
        | {"outcome": {"status": "failure" if n % 3 else "success"}}
        for n in range(20)
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])
    assert derived.summary.chosen == "ask" and len(derived.dataset) == 20
    assert derived.summary.choice.startswith("the largest group with failures (20 cases, 13")
    cron = ingest_trajectories([tmp_path / "t.jsonl"], group="cron")
    assert len(cron.dataset) == 1 and len(cron.summary.repeats) == 49


def test_a_session_giving_turns_on_some_records_only_is_refused_at_the_record(
    tmp_path: Path,
) -> None:
    """A record without a turn, after turn 5, was taken as turn 1: replayed first, as a
    task of its own, without the context it followed up."""
    rows = [
        {"session_id": "s", "turn": 5, "task": "start", "outcome": {"status": "failure"}},
        {"session_id": "s", "task": "and then fix it", "outcome": {"status": "failure"}},
    ]
    _write(tmp_path / "t.jsonl", rows)
    done = _evolane("dataset", "from-trajectory", "t.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr == (
        "evolane: error: t.jsonl:2: gives no 'turn', unlike the first record of session 's' "
        "(t.jsonl:1): give every record's turn, or none\n"
    )
    assert not (tmp_path / "out.jsonl").exists()


def test_targets_alike_only_in_safe_characters_stay_families_of_their_own(
    tmp_path: Path,
) -> None:
    """Group names are made of safe characters: every target in another script was the one
    family ``x``, and ``my agent`` and ``my/agent`` were one."""
    targets = ["客服", "编程", "my agent", "my/agent", "plain"]
    rows = [
        {"session_id": f"s{n}", "turn": 1, "task": f"q{n}", "target": target}
        | {"outcome": {"status": "failure"}}
        for n, target in enumerate(targets)
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])
    names = sorted(g.name for g in derived.summary.groups)
    assert len(names) == 5 and "plain" in names, names
    assert sum(1 for name in names if re.fullmatch(r"x-[0-9a-f]{8}", name)) == 2


def test_bytes_that_are_not_utf8_are_named_as_such(tmp_path: Path) -> None:
    """orjson said "str is not valid UTF-8: surrogates not allowed at column 1" for any
    byte that is not UTF-8 (a gzip or UTF-16 file, a Latin-1 name): no surrogate is there,
    and the byte is often elsewhere. A dataset file is read the same way."""
    (tmp_path / "t.jsonl").write_bytes(b'{"task": "caf\xe9"}\n')
    args = ["dataset", "from-trajectory", "t.jsonl", "-o", "out.jsonl"]
    done = _evolane(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr == "evolane: error: t.jsonl:1: not UTF-8 text (byte 0xe9 at column 14)\n"
    (tmp_path / "d.jsonl").write_bytes(b'{"id": "a", "input": "caf\xe9"}\n')
    with pytest.raises(
        DatasetError, match=r"d\.jsonl:1: not UTF-8 text \(byte 0xe9 at column 26\)$"
    ):
        load_dataset(tmp_path / "d.jsonl")


def _threads(pid: int) -> list[str]:
    """The names of process ``pid``'s threads (trio names a worker after its function)."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue  # the thread ended
    return names


def test_a_ctrl_c_ends_a_run_waiting_for_a_pipe_no_one_writes(tmp_path: Path) -> None:
    """``--from-trajectory`` takes a pipe (``/dev/stdin``, ``<(zcat ...)``), read before the
    run starts; one no program writes (``/dev/stdin`` at a terminal, a FIFO) waits, and a
    Ctrl-C or a SIGTERM then did nothing: the read ran in a worker thread the run could not
    give up, so only SIGKILL ended it (found by README user review). It ends at once
    (exit 130), with no run written."""
    fifo = tmp_path / "traces.jsonl"
    os.mkfifo(fifo)
    (tmp_path / "target").mkdir()
    flags = ["--target", str(tmp_path / "target"), "--store", str(tmp_path / "store")]
    command = [sys.executable, "-m", "evolane", "optimize", "--from-trajectory", str(fifo)]
    started = subprocess.Popen(
        [*command, *flags, "--replay", "true", "--judge", "true", "--optimizer", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(name.startswith("prepare_run") for name in _threads(started.pid)):
            assert started.poll() is None, started.communicate()
            assert time.monotonic() < deadline, "no worker thread waits for the pipe"
            time.sleep(0.05)  # its worker thread waits in open() for a writer
        started.send_signal(signal.SIGINT)
        try:
            out, err = started.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the read end
            raise AssertionError("a Ctrl-C did not end a run waiting for its pipe") from None
    finally:
        started.kill()
        started.wait()
    assert started.returncode == 130, out + err
    assert err == "evolane: interrupted\n"
    assert not (tmp_path / "store" / "runs").exists()
