"""Trajectory ingestion: formats, sessions and follow-ups, missing context, eviction,
grouping, the split, bad lines (through the real CLI), and the published schema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolane.inputs import (
    DatasetError,
    InputError,
    Pinned,
    TrajectoryRecord,
    fit_chain,
    ingest_trajectories,
    input_identity,
    load_dataset,
    refers_back,
    task_fingerprint,
    trajectory_schema,
)
from evolane.inputs._cases import case_json, without_answers


def _write(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _turn(session: str, turn: int, text: str, status: str = "success", **extra: Any) -> dict:
    return {
        "session_id": session,
        "turn": turn,
        "messages": [
            {"role": "user", "content": text},
            {"role": "assistant", "content": f"answer to {text}"},
        ],
        "outcome": {"status": status, "reason": "wrong" if status == "failure" else None},
        **extra,
    }


def _evolane(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from evolane.cli import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)


# -- formats ---------------------------------------------------------------------------------


def test_evolane_records_become_cases_with_outcomes_seeding_expected(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [
            _turn("s1", 0, "Sum 2 and 2", target="calc"),
            _turn("s2", 0, "Sum 3 and 4", "failure", target="calc"),
            {"session_id": "s3", "turn": 0, "task": "Sum 1 and 1", "target": "calc"},
        ],
    )
    derived = ingest_trajectories([path])
    cases = {case.id: case for case in derived.dataset}
    assert set(cases) == {"s1-t0", "s2-t0", "s3-t0"}
    assert cases["s1-t0"].expected_output == "answer to Sum 2 and 2"  # success: the answer
    assert cases["s2-t0"].expected_output is None  # failure: no known-good answer
    assert cases["s2-t0"].metadata["outcome"] == "failure"
    assert cases["s2-t0"].metadata["trace_reason"].startswith("wrong | assistant: answer to")
    assert cases["s3-t0"].input["messages"] == [{"role": "user", "content": "Sum 1 and 1"}]
    assert [f.id for f in derived.summary.failures] == ["s2-t0"]


def test_a_replay_never_sees_what_the_trace_recorded_of_its_turn(tmp_path: Path) -> None:
    """Found by review: a trajectory case's ``{case_file}`` carried ``metadata.outcome``,
    ``score`` and ``trace_reason`` (the judge's reason and the end of the wrong answer) on val
    and test cases: a harness handing the file to its agent told it which answer was wrong.
    The judge and the optimizer's train feedback still read them from the full case."""
    failed = _turn("s2", 0, "Sum 3 and 4", "failure", target="calc")
    failed["outcome"]["score"] = 0.25
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", [failed])])
    (case,) = derived.dataset
    full = orjson.loads(case_json(case))
    assert {"outcome", "score", "trace_reason"} <= set(full["metadata"])
    shown = case_json(case, include_answers=False)
    replayed = orjson.loads(shown)
    assert not {"outcome", "score", "trace_reason"} & set(replayed["metadata"])
    assert b"wrong" not in shown and b"answer to" not in shown
    assert replayed["metadata"]["session"] == "s2" and replayed["input"] == full["input"]
    assert without_answers(case_json(case)) == shown  # the blob the lanes write
    assert case.metadata is not None and "trace_reason" in case.metadata  # left whole


def test_a_replay_never_sees_the_name_of_the_file_a_turn_was_recorded_in(tmp_path: Path) -> None:
    """Found by review: a record without a session was case ``failures-L3``, its case file's
    ``source`` and ``session`` ``failures.jsonl:3``: traces filed by outcome told a tree
    which cases its seed failed (in ``EVOLANE_CASE_ID`` and ``{case_file}``)."""
    for name, status in (("failures", "failure"), ("successes", "success")):
        rows = [
            {"task": f"question {name[0]}{n}", "target": "T", "outcome": {"status": status}}
            for n in range(3)
        ]
        _write(tmp_path / f"{name}.jsonl", rows)
    derived = ingest_trajectories([tmp_path])
    assert len(derived.dataset) == 6
    for case in derived.dataset:
        shown = case_json(case, include_answers=False)
        assert b"failure" not in shown and b"success" not in shown, shown
        assert "failure" not in case.id and "success" not in case.id
        assert case.metadata is not None and case.metadata["source"].endswith(
            ".jsonl:" + case.id[1]
        )
    assert len({case.id for case in derived.dataset}) == 6  # lines alike in two files: digests


def test_plain_chat_lines_are_sessions_of_their_own(tmp_path: Path) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    history = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "read https://x.io/doc"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "now summarise it"},
        ]
    }
    path = _write(tmp_path / "chat.jsonl", [chat, "", history])
    derived = ingest_trajectories([path], group=None)
    groups = {g.name: g for g in derived.summary.groups}
    assert len(groups) == 2 and sum(g.cases for g in groups.values()) == 2
    both = ingest_trajectories([path], group=task_fingerprint("read https://x.io/doc"))
    (case,) = both.dataset.cases
    assert case.id == "L3" and case.metadata["follow_up"] is True  # its context inline
    assert case.input["messages"] == [
        {"role": "user", "content": "read https://x.io/doc"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "now summarise it"},
    ]


def test_a_folder_is_walked_for_jsonl_files_only(tmp_path: Path) -> None:
    _write(tmp_path / "logs" / "a.jsonl", [_turn("a", 0, "one", "failure", target="g")])
    _write(tmp_path / "logs" / "deep" / "b.ndjson", [_turn("b", 0, "two", target="g")])
    (tmp_path / "logs" / "notes.txt").write_text("not a trajectory")
    derived = ingest_trajectories([tmp_path / "logs"])
    assert sorted(c.id for c in derived.dataset) == ["a-t0", "b-t0"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no trajectory files"):
        ingest_trajectories([tmp_path / "empty"])
    with pytest.raises(DatasetError, match="gone: no such file or directory"):
        ingest_trajectories([tmp_path / "gone"])


# -- sessions and follow-ups -------------------------------------------------------------------


def test_follow_ups_carry_their_chain_and_missing_context_propagates(tmp_path: Path) -> None:
    rows = [
        _turn("s", 0, "Draft a memo on https://a.org/brief", target="memo"),
        _turn("s", 1, "Now make it shorter", "failure", target="memo"),
        _turn("s", 2, "Also add a title", target="memo"),
        # turn 3 is missing: 4 refers back to it, 5 follows 4, 6 is a new request
        _turn("s", 4, "Try again with bullet points", target="memo"),
        _turn("s", 5, "x", target="memo", follows=4),
        _turn("s", 6, "Write a haiku about autumn", target="memo"),
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], group="memo")
    cases = {case.id: case for case in derived.dataset}
    assert set(cases) == {"s-t0", "s-t1", "s-t2", "s-t6"}
    chain = cases["s-t2"].input["messages"]
    assert [m["content"] for m in chain] == [
        "Draft a memo on https://a.org/brief",
        "answer to Draft a memo on https://a.org/brief",
        "Now make it shorter",
        "answer to Now make it shorter",
        "Also add a title",
    ]
    assert cases["s-t6"].input["messages"] == [
        {"role": "user", "content": "Write a haiku about autumn"}
    ]  # an independent later request: its own context, not excluded
    excluded = {e.id: e.reason for e in derived.summary.excluded}
    assert excluded == {
        "s-t4": "context_incomplete: turn 3 of session 's' is missing",
        "s-t5": "context_incomplete: it follows turn 4, whose context is incomplete",
    }
    (memo,) = derived.summary.groups
    assert (memo.cases, memo.failures, memo.excluded) == (4, 1, 2)
    assert memo.completeness == pytest.approx(4 / 6)


def test_a_session_starting_late_with_a_follow_up_is_incomplete(tmp_path: Path) -> None:
    rows = [
        _turn("late", 7, "Fix it please", target="g"),
        _turn("late", 8, "Summarise the report", "failure", target="g"),
        _turn("first", 1, "Then do the rest", "failure", target="g"),  # nothing before it
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])
    assert {e.id for e in derived.summary.excluded} == {"late-t7"}
    assert {c.id for c in derived.dataset} == {"late-t8", "first-t1"}


@pytest.mark.parametrize(
    ("text", "back"),
    [
        ("Now make it shorter", True),
        ("and in French", True),
        ("Try again, it failed", True),
        ("Use the same file as before", True),
        ("What about the previous answer?", True),
        ("Summarise this article about nowcasting", False),
        ("Android app crash report", False),
        ("Write a haiku", False),
    ],
)
def test_refers_back(text: str, back: bool) -> None:
    assert refers_back(text) is back


# -- eviction --------------------------------------------------------------------------------


_texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_texts, min_size=1, max_size=12),
    st.lists(st.from_regex(r"https://[a-z]{1,12}\.io/[a-z0-9]{0,20}", fullmatch=True), max_size=4),
    st.lists(st.from_regex(r"[a-z]{1,12}\.(pdf|png|csv)", fullmatch=True), max_size=4),
    st.integers(0, 4000),
)
def test_eviction_fits_the_budget_and_keeps_the_first_turns_urls_and_artifacts(
    texts: list[str], urls: list[str], artifacts: list[str], budget: int
) -> None:
    first = " ".join(["see", *urls]) + ("\n[attached: " + ", ".join(artifacts) + "]")
    messages = [{"role": "user", "content": first}] + [
        {"role": "assistant" if i % 2 == 0 else "user", "content": text}
        for i, text in enumerate(texts)
    ]
    pinned = Pinned(tuple(dict.fromkeys(urls)), tuple(dict.fromkeys(artifacts)))
    chain = fit_chain(messages, pinned, budget)
    note = pinned.note()
    note_size = _size(note) if note else 0
    assert sum(_size(m) for m in chain) <= max(budget, note_size)
    shown = "\n".join(m["content"] for m in chain)
    for item in (*urls, *artifacts):
        assert item in shown
    if _size(messages[-1]) + note_size <= budget:
        assert chain[-1] == messages[-1]  # the newest is kept whole when it fits


def _size(message: dict[str, Any]) -> int:
    return len(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))


def test_a_long_session_keeps_the_first_turns_url_and_attachment(tmp_path: Path) -> None:
    first = _turn("s", 0, "Analyse https://data.org/q3.csv", target="g")
    first["metadata"] = {"attachments": ["q3.csv"]}
    rows = [first] + [
        _turn("s", i, f"And then step {i} " + "x" * 400, target="g") for i in range(1, 30)
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], context_budget=2000)
    last = derived.dataset.by_id("s-t29").input["messages"]
    text = json.dumps(last)
    assert "https://data.org/q3.csv" in text and "q3.csv" in text
    assert last[0]["content"].startswith("[earlier context, shortened]")
    assert last[-1]["content"].startswith("And then step 29")
    assert len(json.dumps(last[:-1]).encode()) <= 2000 + 200  # JSON spacing differs a little


# -- grouping --------------------------------------------------------------------------------


def test_the_fingerprint_ignores_case_and_whitespace() -> None:
    assert task_fingerprint("Summarise  the\nReport ") == task_fingerprint("summarise the report")
    assert task_fingerprint("summarise the report") != task_fingerprint("summarise the memo")


def _families(tmp_path: Path) -> Path:
    rows = [_turn(f"a{i}", 0, "Sort the list", "failure" if i < 2 else "success") for i in range(3)]
    rows += [_turn(f"c{i}", 0, f"Plan trip {i}", target="travel") for i in range(5)]
    rows += [_turn(f"d{i}", 0, "Fix bug", "failure", target="bugs") for i in range(2)]
    return _write(tmp_path / "t.jsonl", rows)


def test_the_largest_group_with_failures_is_chosen_by_default(tmp_path: Path) -> None:
    derived = ingest_trajectories([_families(tmp_path)])
    sort = task_fingerprint("sort the list")
    assert derived.summary.chosen == sort  # travel is larger but has no failure
    assert "largest group with failures" in derived.summary.choice
    assert [g.name for g in derived.summary.groups if g.chosen] == [sort]
    assert {c.metadata["group"] for c in derived.dataset} == {sort}
    picked = ingest_trajectories([_families(tmp_path)], group="travel")
    assert len(picked.dataset) == 5 and picked.summary.choice == "--group travel"
    with pytest.raises(InputError, match="--group nope: no such group"):
        ingest_trajectories([_families(tmp_path)], group="nope")


def test_sessions_with_the_same_first_turn_modulo_spacing_share_a_group(tmp_path: Path) -> None:
    rows = [_turn("x", 0, "Sort the list", "failure"), _turn("y", 0, "  SORT the\tlist ")]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])
    assert len(derived.summary.groups) == 1 and derived.summary.groups[0].cases == 2
    assert len(derived.dataset) == 1  # one task: the second is a repeat of the first
    assert [e.id for e in derived.summary.repeats] == ["y-t0"]


def _identities(derived: Any) -> list[bytes]:
    return [input_identity(case.input) for case in derived.dataset]


def test_the_same_task_in_many_sessions_is_one_case_not_one_per_split(tmp_path: Path) -> None:
    """Found by review: sessions were dealt by session id, so 20 sessions of one task gave
    8 train, 8 val and 4 test cases with one input: the gate judged what the optimizer saw,
    and val counted one task 8 times. A repeated input is left out, and listed."""
    rows = [_turn(f"s{i}", 1, "Fix the login bug", "failure" if i % 2 else "success")
            for i in range(20)]  # fmt: skip
    path = _write(tmp_path / "t.jsonl", rows)
    derived = ingest_trajectories([path], seed=2)
    assert len(derived.dataset) == 1
    kept = next(iter(derived.dataset)).id
    assert len(derived.summary.repeats) == 19
    assert all(
        e.reason == f"repeat: the same input as case {kept}" for e in derived.summary.repeats
    )
    shown = _evolane("dataset", "from-trajectory", str(path), "-o", str(tmp_path / "c.jsonl"))
    assert shown.returncode == 0, shown.stderr
    assert "left out (the same input as an earlier case): 19" in shown.stdout + shown.stderr
    assert "wrote 1 cases" in shown.stdout + shown.stderr


def test_a_different_input_field_or_chain_keeps_a_case(tmp_path: Path) -> None:
    """Only an identical input is a repeat: the same request with another ``input``, or a
    follow-up after another answer, is another case; a follow-up after the same exchange
    is a repeat."""
    rows = [
        _turn("a", 0, "Summarise the file", input={"file": "a.txt"}, target="files"),
        _turn("b", 0, "Summarise the file", input={"file": "b.txt"}, target="files"),
        _turn("c", 0, "Write a poem", target="poems"),
        _turn("c", 1, "now make it shorter", target="poems"),
        _turn("d", 0, "Write a poem", target="poems"),
        _turn("d", 1, "now make it shorter", target="poems"),
        _turn("e", 0, "Write a haiku", target="poems"),
        _turn("e", 1, "now make it shorter", target="poems"),
    ]
    path = _write(tmp_path / "t.jsonl", rows)
    files = ingest_trajectories([path], group="files")
    assert sorted(case.id for case in files.dataset) == ["a-t0", "b-t0"]
    poems = ingest_trajectories([path], group="poems")
    assert sorted(case.id for case in poems.dataset) == ["c-t0", "c-t1", "e-t0", "e-t1"]
    assert [(e.id, e.reason) for e in poems.summary.repeats] == [
        ("d-t0", "repeat: the same input as case c-t0"),
        ("d-t1", "repeat: the same input as case c-t1"),
    ]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(["Fix it", "fix  IT", "Sort", "Plan"]), st.integers(0, 2)),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 5),
)
def test_no_two_cases_share_an_input_and_every_repeat_names_a_kept_case(
    tmp_path: Path, sessions: list[tuple[str, int]], seed: int
) -> None:
    rows = [
        _turn(f"s{index}", step, text if step == 0 else f"now step {step}", target="g")
        for index, (text, steps) in enumerate(sessions)
        for step in range(steps + 1)
    ]
    derived = ingest_trajectories([_write(tmp_path / "h.jsonl", rows)], seed=seed)
    identities = _identities(derived)
    assert len(set(identities)) == len(identities)
    kept = {case.id for case in derived.dataset}
    assert len(kept) + len(derived.summary.repeats) == len(rows)
    assert all(e.reason.rsplit(" ", 1)[1] in kept for e in derived.summary.repeats)


# -- the split -------------------------------------------------------------------------------


def _outcomes(tmp_path: Path) -> Path:
    statuses = ["failure"] * 10 + ["success"] * 15 + ["unknown"] * 5
    rows = [_turn(f"s{i:02d}", 0, f"task {i}", s, target="g") for i, s in enumerate(statuses)]
    return _write(tmp_path / "t.jsonl", rows)


def test_a_text_input_alike_up_to_case_and_spacing_is_one_case(tmp_path: Path) -> None:
    """Found by review: the same request given as ``input`` ("Fix the Bug", "fix the  bug
    ") was two cases, one of them possibly in test while the optimizer saw the other."""
    rows = [
        {"session_id": "a", "input": "Fix the Bug in parser.py", "target": "g"},
        {"session_id": "b", "input": " fix the  bug in PARSER.py", "target": "g"},
        {"session_id": "c", "input": {"file": "parser.py"}, "target": "g"},
        {"session_id": "d", "input": {"file": "Parser.py"}, "target": "g"},
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])
    assert [c.id for c in derived.dataset] == ["a-t0", "c-t0", "d-t0"]
    assert [e.reason for e in derived.summary.repeats] == ["repeat: the same input as case a-t0"]


def test_the_split_is_seeded_and_stratified_by_outcome(tmp_path: Path) -> None:
    path = _outcomes(tmp_path)
    one, again = ingest_trajectories([path], seed=3), ingest_trajectories([path], seed=3)
    other = ingest_trajectories([path], seed=4)
    assert one.dataset.digest == again.dataset.digest
    assert [c.split for c in one.dataset] != [c.split for c in other.dataset]
    by = Counter((c.metadata["outcome"], c.split) for c in one.dataset)
    assert by[("failure", "val")] == 4 and by[("failure", "train")] == 4
    assert by[("failure", "test")] == 2
    assert by[("success", "val")] == 6 and by[("success", "test")] == 3
    assert by[("unknown", "val")] == 2 and by[("unknown", "test")] == 1


def test_whole_sessions_are_dealt_so_no_split_holds_another_splits_turns(tmp_path: Path) -> None:
    """Found by review: turns were dealt one by one, and a later turn's input holds the
    earlier turns and their answers, so val and test cases reached the optimizer."""
    rows = [
        _turn(f"s{i:02d}", n, f"task {i} step {n}", "failure" if (i + n) % 4 == 0 else "success")
        | {"target": "g"}
        for i in range(12)
        for n in range(5)
    ]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], seed=5)
    splits: dict[str, set[str]] = {}
    for case in derived.dataset:
        splits.setdefault(case.id.rsplit("-t", 1)[0], set()).add(case.split)
    assert len(splits) == 12 and all(len(found) == 1 for found in splits.values()), splits
    dealt = Counter(next(iter(found)) for found in splits.values())
    assert dealt["val"] >= 4 and dealt["train"] >= 4 and dealt["test"] >= 2, dealt


def test_records_without_a_session_id_of_one_conversation_share_a_split(tmp_path: Path) -> None:
    """Found by review: API-call logs carry no session id, each record holding the
    conversation so far; dealt one by one, 24 of 36 val and test turns sat inside train
    inputs. Records opening with the same first user message are dealt together."""
    rows = []
    for conversation in range(12):
        history: list[dict[str, str]] = []
        for step in range(5):
            ask = {"role": "user", "content": f"conversation {conversation} question {step}"}
            said = {"role": "assistant", "content": f"answer {conversation}-{step}"}
            status = "failure" if (conversation + step) % 4 == 0 else "success"
            rows.append(
                {"messages": [*history, ask, said], "target": "g"}
                | {
                    "outcome": {
                        "status": status,
                        "reason": "wrong" if status == "failure" else None,
                    }
                }
            )
            history += [ask, said]
    derived = ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)], seed=1)
    by_conversation: dict[str, set[str]] = {}
    for case in derived.dataset:
        opening = re.search(r"conversation (\d+) question 0", json.dumps(case.input))
        assert opening is not None
        by_conversation.setdefault(opening.group(1), set()).add(case.split)
    assert len(by_conversation) == 12, by_conversation
    assert all(len(splits) == 1 for splits in by_conversation.values()), by_conversation


# -- bad lines, through the real CLI ---------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "a record must be a JSON object, got an array"),
        ('{"messages": [], "nope": 1}', "unknown key 'nope'"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "field 'messages.0.role'"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}', "no request"),
        ('{"session_id": "s", "turn": 2, "follows": 5, "task": "x"}', "'follows' must name"),
        ('{"session_id": "s", "turn": -1, "task": "x"}', "field 'turn'"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line_with_exit_2(
    tmp_path: Path, line: str, reason: str
) -> None:
    good = json.dumps(_turn("ok", 0, "fine", "failure"))
    _write(tmp_path / "bad.jsonl", [good, "", line])
    done = _evolane("dataset", "from-trajectory", "bad.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (message,) = done.stderr.strip().splitlines()
    assert message.startswith("evolane: error: bad.jsonl:3: ") and reason in message
    assert not (tmp_path / "out.jsonl").exists()  # nothing half-written


def test_a_duplicate_turn_is_refused_with_both_places(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_turn("s", 1, "a"), _turn("s", 1, "b")])
    with pytest.raises(DatasetError, match=r"t\.jsonl:2: turn 1 of session 's' again"):
        ingest_trajectories([path])


def test_dataset_from_trajectory_writes_a_loadable_dataset_and_prints_groups(
    tmp_path: Path,
) -> None:
    rows = [_turn("s", 0, "Plan a trip", "failure", target="travel"), _turn("s", 2, "and back")]
    _write(tmp_path / "t.jsonl", [*rows, _turn("o", 0, "x", target="other")])
    done = _evolane("dataset", "from-trajectory", "t.jsonl", "-o", "cases.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "* travel: 1 cases, 1 failures, 50% complete" in done.stdout
    assert "chosen: travel (the largest group with failures" in done.stdout
    assert "s-t2 [travel]: context_incomplete: turn 1 of session 's' is missing" in done.stdout
    loaded = load_dataset(tmp_path / "cases.jsonl")
    assert [c.id for c in loaded] == ["s-t0"]


def test_schema_trajectory_prints_the_record_schema() -> None:
    done = _evolane("schema", "trajectory")
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema == json.loads(json.dumps(trajectory_schema()))
    assert {"session_id", "turn", "task", "input", "messages", "outcome", "follows"} <= set(
        schema["properties"]
    )
    TrajectoryRecord.model_validate({"messages": [{"role": "user", "content": "x"}]})


def test_an_inline_history_keeps_its_first_turns_attachment_under_a_small_budget(
    tmp_path: Path,
) -> None:
    first = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Check https://x.io/spec against it"},
            {"type": "file", "file": {"filename": "spec-v2.pdf", "file_data": "..."}},
        ],
    }
    later = [
        {"role": "assistant" if i % 2 == 0 else "user", "content": f"turn {i} " + "y" * 300}
        for i in range(10)
    ]
    line = {"messages": [first, *later, {"role": "user", "content": "and the appendix?"}]}
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", [line])], context_budget=900)
    messages = derived.dataset.cases[0].input["messages"]
    text = json.dumps(messages)
    assert "https://x.io/spec" in text and "spec-v2.pdf" in text
    assert "turn 0 " not in text and "turn 9 " in text  # the oldest went, the newest stayed


def test_a_long_group_list_keeps_the_chosen_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import evolane.inputs._trajectory as trajectory

    monkeypatch.setattr(trajectory, "MAX_LISTED", 2)
    rows = [_turn(f"s{i}", 0, f"task {i}", "failure", target=f"g{i}") for i in range(4)]
    rows.append(_turn("big", 0, "a", target="g0"))
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], group="g3")
    assert [g.name for g in derived.summary.groups] == ["g0", "g3"]
    assert derived.summary.omitted == {"groups": 2}


# -- bounds ----------------------------------------------------------------------------------


def test_records_past_the_cap_are_refused_at_their_line_with_exit_2(tmp_path: Path) -> None:
    """The real cap, through the real CLI: the record past it is named by file:line before
    any line is parsed (``{}`` is not a valid record, yet the count refuses first)."""
    from evolane.inputs import MAX_TRAJECTORY_RECORDS

    (tmp_path / "big.jsonl").write_bytes(b"\n" + b"{}\n" * (MAX_TRAJECTORY_RECORDS + 1))
    done = _evolane("dataset", "from-trajectory", "big.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (message,) = done.stderr.strip().splitlines()
    line = MAX_TRAJECTORY_RECORDS + 2  # the blank first line is not a record
    assert message.startswith(f"evolane: error: big.jsonl:{line}: more than ")
    assert f"{MAX_TRAJECTORY_RECORDS:,} trajectory records in all" in message
    assert not (tmp_path / "out.jsonl").exists()


def test_the_record_cap_counts_across_files(tmp_path: Path) -> None:
    from evolane.inputs._trajectory_read import read_trajectories

    _write(tmp_path / "a.jsonl", [_turn("a", 0, "x"), _turn("a", 1, "y")])
    _write(tmp_path / "b.jsonl", [_turn("b", 0, "x"), "", _turn("b", 1, "y")])
    assert len(read_trajectories([tmp_path], max_records=4)) == 4
    with pytest.raises(DatasetError, match=r"b\.jsonl:3: more than 3 trajectory records"):
        read_trajectories([tmp_path], max_records=3)


def test_a_deeply_nested_fields_path_is_cut_in_its_one_line_error(tmp_path: Path) -> None:
    value: Any = 1
    for depth in range(260):
        value = {"list": [value]} if depth % 2 else {"a": value}
    (tmp_path / "deep.jsonl").write_text(json.dumps({"task": "x", "metadata": value}) + "\n")
    done = _evolane("dataset", "from-trajectory", "deep.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (message,) = done.stderr.strip().splitlines()
    assert message.startswith("evolane: error: deep.jsonl:1: field 'metadata.")
    assert "...': nested too deeply" in message and len(message) < 200, message


def test_derived_cases_over_a_datasets_size_are_refused_at_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import evolane.inputs._trajectory as trajectory

    monkeypatch.setattr(trajectory, "MAX_CASES_BYTES", 2000)
    rows = [_turn("s", t, "and then " + "w" * 300) for t in range(12)]
    with pytest.raises(DatasetError, match=r"t\.jsonl:\d+: the cases of group .* over the"):
        ingest_trajectories([_write(tmp_path / "t.jsonl", rows)])


def test_a_long_session_of_follow_ups_gives_each_case_a_bounded_chain(tmp_path: Path) -> None:
    """Chains are walked back from each turn, not held per turn (a session of n follow-ups
    held n chains of up to n turns); each case still carries the newest that fit."""
    rows = [_turn("s", 0, "Start the report", target="r")]
    rows += [_turn("s", t, f"and then part {t}", target="r") for t in range(1, 3000)]
    derived = ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], context_budget=600)
    last = derived.dataset.by_id("s-t2999").input["messages"]
    assert last[-1]["content"] == "and then part 2999"
    assert last[-2]["content"] == "answer to and then part 2998"
    assert len(orjson.dumps(last[:-1])) <= 600 + 2 * len(last)
