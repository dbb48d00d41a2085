"""Trajectory ingestion under hostile and awkward inputs (found by review): records whose
``task`` or ``input`` stands for their first message, case ids that the safe form of a
session id or file name makes equal, long chains of follow-ups, inputs that are pipes,
the same file given twice, and runs of blank lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evolane.inputs import ingest_trajectories


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
