"""The live agent: it answers tasks with the skill it reads at each task (so it uses a
published improvement from the next task on), and writes one trajectory record per task.

A task is a session trace to decide on (should its lesson be persisted, and how?), drawn
from the self-evolution generator; the record's outcome is the reward's verdict, so a wrong
answer is a recorded failure with the judge's reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evolane.examples.selfevolve._agent import decide
from evolane.examples.selfevolve._cases import make_case
from evolane.examples.selfevolve._reward import score
from evolane.examples.selfevolve._skill import parse_skill

PASS_SCORE = 0.7
"""A task whose answer scores below this is recorded as a failure (its action or evidence is
wrong); at or above, a success with a small flaw (its verification)."""
LIVE_SEED = 50_000
"""Live tasks draw from their own seed range (disjoint from the benchmark's splits)."""


def live_case(index: int) -> dict[str, Any]:
    """Live task ``index`` as the generator makes it (its trace and its right answer)."""
    return make_case("live", index, LIVE_SEED + index)


def task_record(target: Path, index: int) -> dict[str, Any]:
    """Answer live task ``index`` with ``target``'s current skill; its trajectory record."""
    case = live_case(index)
    trace = case["input"]["trace"]
    answer = decide(parse_skill((target / "skill" / "SKILL.md").read_text()), trace)
    verdict = score(answer, case["expected_output"], trace)
    ok = verdict["score"] >= PASS_SCORE
    outcome: dict[str, Any] = {"status": "success" if ok else "failure", "score": verdict["score"]}
    if not ok:
        outcome["reason"] = str(verdict.get("reason") or "partial answer")[:200]
    return {
        "id": f"live-{index:04d}",
        "session_id": f"session-{index:04d}",
        "turn": 1,
        "target": "persist-lesson",
        "input": {"trace": trace, "task": index},
        "messages": [
            {"role": "user", "content": f"Should this session's lesson be persisted?\n{trace}"},
            {"role": "assistant", "content": json.dumps(answer, sort_keys=True)},
        ],
        "outcome": outcome,
    }


def run_tasks(target: Path, first: int, count: int) -> Iterator[dict[str, Any]]:
    """Records of live tasks ``first`` .. ``first + count - 1``, one at a time."""
    for index in range(first, first + count):
        yield task_record(target, index)


def expected_for(case: dict[str, Any]) -> dict[str, Any]:
    """The right answer of a case derived from a live task's record."""
    return live_case(int(case["input"]["input"]["task"]))["expected_output"]
