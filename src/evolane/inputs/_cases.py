"""One dataset row (DESIGN §8) as a validated `Case`, and its canonical JSON bytes."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Literal

import orjson
from pydantic import AfterValidator, Field, JsonValue

from evolane.inputs._errors import InputError
from evolane.inputs._templates import VERIFICATION_PLACEHOLDERS, CommandTemplate
from evolane.messages import Record

Split = Literal["train", "val", "test"]
"""The split a case belongs to."""
SPLITS: tuple[Split, ...] = ("train", "val", "test")
"""Every split, in their conventional order."""
MAX_CASE_ID_CHARS = 128
"""Upper bound on the length of a case id, in characters."""


def _check_case_id(value: str) -> str:
    """Refuse ids that would be unsafe as a file name or unreadable in a report."""
    if "/" in value:
        raise ValueError("must not contain '/'")
    if value in (".", ".."):
        raise ValueError(f"must not be {value!r}")
    if any(unicodedata.category(char) == "Cc" for char in value):
        raise ValueError("must not contain control characters")
    return value


def _check_verification(value: str | None) -> str | None:
    """A verification command must be a valid template for its placeholders."""
    if value is not None:
        CommandTemplate.parse(value, role="verification", allowed=VERIFICATION_PLACEHOLDERS)
    return value


MAX_CLUSTER_CHARS = 256
"""Upper bound on the length of a cluster name (``metadata.cluster``), in characters."""


def _check_metadata(value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
    """``metadata.cluster``, when present, is a cluster name: a string of 1 to 256
    characters (or an integer, read as its decimal string)."""
    if value is None or "cluster" not in value:
        return value
    cluster = value["cluster"]
    if isinstance(cluster, bool) or not isinstance(cluster, str | int):
        # its own kind, not the metadata's: "(got an object)" named the wrong value
        got = orjson.dumps(cluster)[:40].decode(errors="replace")
        raise InputError(
            f"metadata.cluster must be a string (the name of the case's cluster), got {got}"
        )
    if not 1 <= len(str(cluster)) <= MAX_CLUSTER_CHARS:
        raise ValueError(f"metadata.cluster must have 1 to {MAX_CLUSTER_CHARS} characters")
    return value


def cluster_of(case: Case) -> str | None:
    """The cluster a case belongs to, or None (a cluster of its own): ``metadata.cluster``;
    else, for a case ingested from trajectories before clusters were written (``metadata``
    with ``session`` and ``turn``), its session. Cases of one cluster are not independent
    (the turns of one session): the statistics take each cluster as one observation."""
    metadata = case.metadata or {}
    cluster = metadata.get("cluster")
    if cluster is not None:
        return "cluster:" + str(cluster)
    session = metadata.get("session")
    if isinstance(session, str) and "turn" in metadata:
        return "session:" + session
    return None


CaseId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_CASE_ID_CHARS),
    AfterValidator(_check_case_id),
]
"""A case id: 1 to 128 characters, no control characters, no '/', not '.' or '..'."""


class Case(Record):
    """One dataset row; an optional field that is ``None`` is absent (a JSON ``null`` is too).

    ``input``, ``expected_output`` and ``metadata`` hold plain JSON values: treat them as
    read-only, since a `Dataset`'s digest was taken from them.
    """

    id: CaseId
    input: JsonValue
    expected_output: JsonValue = None
    verification_command: Annotated[str | None, AfterValidator(_check_verification)] = None
    split: Split = "val"
    metadata: Annotated[dict[str, JsonValue] | None, AfterValidator(_check_metadata)] = None

    def verification_template(self) -> CommandTemplate | None:
        """The parsed ``verification_command`` (role ``verification``), or ``None``."""
        if self.verification_command is None:
            return None
        return CommandTemplate.parse(
            self.verification_command, role="verification", allowed=VERIFICATION_PLACEHOLDERS
        )


ANSWER_FIELDS = ("expected_output", "verification_command", "split")
"""The fields a replay never sees (`case_row` and `without_answers` leave them out): the
answers, and the split, which told a tree whether its case is val or test (it could answer
well only where the gate or the confirmation looks; found by review)."""
RECORDED_FIELDS = ("outcome", "score", "trace_reason", "source")
"""The ``metadata`` keys a replay never sees either: what a trace recorded of the turn (its
status, score, the judge's reason and the end of its wrong answer) and where (its file and
line: traces filed by outcome name it). Found by review: a trajectory case's
``{case_file}`` carried them on val and test cases, so a harness that hands the case file
to its agent told it which answer was wrong; an edit reading them gains on val and test
alike, a gain no production request gives."""


def case_row(case: Case, *, include_answers: bool = True) -> dict[str, JsonValue]:
    """The case as a JSON row: absent optional fields are left out, ``split`` is always there.

    ``include_answers=False`` (a replay's copy) also leaves out ``expected_output``,
    ``verification_command`` and ``split`` (`ANSWER_FIELDS`), and the recorded outcome in
    ``metadata`` (`RECORDED_FIELDS`).
    """
    row: dict[str, JsonValue] = {"id": case.id, "input": case.input, "split": case.split}
    optional = {
        "expected_output": case.expected_output,
        "verification_command": case.verification_command,
        "metadata": case.metadata,
    }
    row.update((name, value) for name, value in optional.items() if value is not None)
    return row if include_answers else _answerless(row)


def _answerless(row: dict[str, JsonValue]) -> dict[str, JsonValue]:
    for name in ANSWER_FIELDS:
        row.pop(name, None)
    metadata = row.get("metadata")
    if isinstance(metadata, dict) and any(name in metadata for name in RECORDED_FIELDS):
        row["metadata"] = {k: v for k, v in metadata.items() if k not in RECORDED_FIELDS}
    return row


def case_json(case: Case, *, include_answers: bool = True) -> bytes:
    """The canonical JSON of the case (sorted keys, compact, stable): the ``{case_file}`` bytes.

    Raises ``orjson.JSONEncodeError`` for a value nested deeper than orjson can write
    (about 250 levels); `load_dataset` refuses such rows up front.
    """
    row = case_row(case, include_answers=include_answers)
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS)


def without_answers(canonical: bytes) -> bytes:
    """A case's canonical JSON (`case_json`) as ``case_json(case, include_answers=False)``
    gives it, without building the `Case`."""
    return orjson.dumps(_answerless(orjson.loads(canonical)), option=orjson.OPT_SORT_KEYS)
