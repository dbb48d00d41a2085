"""Messages and journal records: bounded by schema, maximal instances fit their size limit
(MAX_MESSAGE_BYTES, a journal line), always validated; each public name has one home."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Literal

import orjson
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field

import evolane
from evolane.messages import (
    JOURNAL_RECORDS,
    MAX_MESSAGE_BYTES,
    ArtifactRef,
    JudgeResult,
    Message,
    ProposalRecord,
    ProposeResult,
    Record,
    ReplayRecord,
    ReplayResult,
    UnitRecord,
    message_classes,
    message_schemas,
    parse_journal_record,
    unbounded_fields,
)
from evolane.store import MAX_RECORD_BYTES
from evolane.store._journal import encode_record


def _import_everything() -> None:
    for module in pkgutil.walk_packages(evolane.__path__, "evolane."):
        if not module.name.endswith(".__main__"):  # importing those would run a CLI
            importlib.import_module(module.name)


_import_everything()
ALL_MESSAGES = list(message_classes().values())
ALL_RECORDS = list(JOURNAL_RECORDS.values())
# Characters whose JSON encoding is the largest per character (escapes, multi-byte UTF-8).
HEAVY_CHARS = st.sampled_from(["a", "\x00", '"', "\\", "é", "\u2028", "\U0001f600"])


def test_there_are_messages_to_check() -> None:
    assert {"ping", "pong", "stress.work"} <= set(message_classes())


@pytest.mark.parametrize("cls", ALL_MESSAGES + ALL_RECORDS, ids=lambda c: c.__name__)
def test_every_message_class_and_journal_record_is_bounded(cls: type[Record]) -> None:
    assert unbounded_fields(cls) == []


def test_the_bounds_walker_catches_unbounded_fields() -> None:
    class Loose(Record):
        text: str
        items: list[int]
        table: dict[str, int] = Field(default_factory=dict, max_length=3)
        nested: ArtifactRef | None = None
        blob: bytes = Field(default=b"", max_length=10)

    problems = unbounded_fields(Loose)
    assert any("text" in p and "max_length" in p for p in problems)
    assert any("items" in p for p in problems)
    assert any("table" in p and "keys" in p for p in problems)
    assert any("blob" in p and "bytes" in p for p in problems)
    assert not any("nested" in p for p in problems)


def _maximal(node: dict[str, Any], defs: dict[str, Any], draw: Any) -> Any:
    """The largest JSON value ``node`` admits, with heavy characters drawn by hypothesis."""
    if "$ref" in node:
        return _maximal(defs[node["$ref"].rsplit("/", 1)[-1]], defs, draw)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return max(node["enum"], key=lambda v: len(orjson.dumps(v)))
    branches = node.get("anyOf") or node.get("oneOf")
    if branches:
        values = [_maximal(b, defs, draw) for b in branches]
        return max(values, key=lambda v: len(orjson.dumps(v)))
    kind = node.get("type")
    if kind == "string":
        if "pattern" in node:
            return draw(st.from_regex(node["pattern"], fullmatch=True))
        char = draw(HEAVY_CHARS)
        return char * node["maxLength"]
    if kind == "integer":
        return int(node.get("maximum", -(2**63)))
    if kind == "number":
        low = node.get("minimum", node.get("exclusiveMinimum", -1.7976931348623157e308))
        high = node.get("maximum", node.get("exclusiveMaximum", 1.7976931348623157e308))
        candidates = [-1.7976931348623157e308, low + (high - low) / 3, high * (1 - 1e-16), low]
        valid = [
            v
            for v in candidates
            if (low <= v if "exclusiveMinimum" not in node else low < v)
            and (v <= high if "exclusiveMaximum" not in node else v < high)
        ]
        return max(valid, key=lambda v: len(orjson.dumps(v)))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        items = [_maximal(node["items"], defs, draw) for _ in range(node["maxItems"])]
        if node.get("uniqueItems"):  # as long, each different: its own number at its end
            items = [item[: -len(str(i))] + str(i) for i, item in enumerate(items)]
        return items
    if kind == "object":
        value = {k: _maximal(v, defs, draw) for k, v in node.get("properties", {}).items()}
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            key_len = node.get("propertyNames", {}).get("maxLength", 8)
            for i in range(node["maxProperties"]):
                key = f"{i:0{key_len}d}"[-key_len:]
                value[key] = _maximal(extra, defs, draw)
        return value
    raise AssertionError(f"no maximal value for schema node {node}")


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_maximal_instances_fit_the_message_size_limit(cls: type[Message], data: Any) -> None:
    schema = cls.model_json_schema(mode="validation")
    raw = _maximal(schema, schema.get("$defs", {}), data.draw)
    instance = cls.model_validate(raw)
    size = len(orjson.dumps(instance.model_dump(mode="json")))
    assert size <= MAX_MESSAGE_BYTES, f"{cls.__name__}: {size} bytes"


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@pytest.mark.parametrize("char", HEAVY_CHARS.elements, ids=repr)
def test_maximal_instances_of_each_heavy_character_fit(char: str) -> None:
    """The property above with one character in every string, each in turn: found by the
    property only once in many runs, an `EstimateEvent` of eight preflight lines of NUL
    (6 bytes each as JSON) came to 16,966 bytes; every kind is checked each run now."""

    def draw(strategy: Any) -> Any:
        return char if strategy is HEAVY_CHARS else strategy.example()

    over = {}
    for cls in ALL_MESSAGES:
        schema = cls.model_json_schema(mode="validation")
        instance = cls.model_validate(_maximal(schema, schema.get("$defs", {}), draw))
        size = len(orjson.dumps(instance.model_dump(mode="json")))
        if size > MAX_MESSAGE_BYTES:
            over[cls.__name__] = size
    assert over == {}


@pytest.mark.parametrize("cls", ALL_RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_maximal_journal_records_fit_a_journal_line(cls: type[Record], data: Any) -> None:
    schema = cls.model_json_schema(mode="validation")
    raw = _maximal(schema, schema.get("$defs", {}), data.draw)
    line = encode_record(cls.model_validate(raw))
    assert len(line) <= MAX_RECORD_BYTES, f"{cls.__name__}: {len(line)} bytes"


def test_messages_are_frozen_closed_and_always_validated() -> None:
    ping = evolane.messages.Ping(seq=1)
    with pytest.raises(pydantic.ValidationError):
        ping.seq = 2  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        evolane.messages.Ping(seq=1, extra=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        evolane.messages.Ping.model_construct(seq=-5)
    with pytest.raises(pydantic.ValidationError):
        ping.model_copy(update={"seq": -5})
    assert ping.model_copy(update={"seq": 9}).seq == 9


def test_a_message_kind_can_be_used_by_one_class_only() -> None:
    with pytest.raises(TypeError, match="used by"):

        class Impostor(Message):
            kind: Literal["ping"] = "ping"


def test_schema_export_covers_every_kind() -> None:
    schema = message_schemas()
    assert set(schema["kinds"]) == set(message_classes())
    assert {cls.__name__ for cls in ALL_MESSAGES} <= set(schema["$defs"])
    orjson.dumps(schema)


def test_each_name_of_messages_stats_and_measure_has_one_public_home() -> None:
    homes: dict[str, list[str]] = {}
    for module in pkgutil.iter_modules(evolane.__path__):
        if module.ispkg:
            package = importlib.import_module(f"evolane.{module.name}")
            for name in getattr(package, "__all__", ()):
                homes.setdefault(name, []).append(module.name)
    mine = {"messages", "stats", "measure"}
    shared = {name: where for name, where in homes.items() if len(where) > 1 and mine & set(where)}
    assert shared == {}


# ----- journal records ----------------------------------------------------------------------

DIGEST = "sha256:" + "ab" * 32
OUTPUT = {"digest": DIGEST, "size": 6, "media_type": "application/json"}


def _results() -> tuple[ReplayResult, JudgeResult, ProposeResult]:
    replay = ReplayResult(
        unit_id="m.0.0.b",
        case_id="c0",
        arm="baseline",
        repetition=0,
        status="succeeded",
        output_ref=ArtifactRef.model_validate(OUTPUT),
        wall_seconds=0.25,
    )
    judge = JudgeResult(unit_id="m.0.0.b", status="succeeded", score=0.5, source="exact_match")
    proposal = ProposeResult(slot_id="c0.i0.s0", status="failed")
    return replay, judge, proposal


def test_journal_records_write_the_lines_of_the_dicts_they_replace() -> None:
    replay, judge, proposal = _results()
    as_dicts = [
        {
            "type": "unit",
            "measurement": "m",
            "unit": "m.0.0.b",
            "tree": DIGEST,
            "status": "succeeded",
            "reused": False,
            "replay": replay.model_dump(mode="json"),
            "judge": judge.model_dump(mode="json"),
            "key": None,  # a line without it (an older journal) reads the same
        },
        {
            "type": "replay",
            "measurement": "m",
            "unit": "m.0.0.b",
            "tree": DIGEST,
            "replay": replay.model_dump(mode="json"),
            "key": None,  # as a unit's: a line without it reads the same
        },
        {
            "type": "proposal",
            "slot": "c0.i0.s0",
            "result": proposal.model_dump(mode="json"),
            "parent": None,  # as a unit's key
        },
    ]
    records = [
        UnitRecord(
            measurement="m",
            unit="m.0.0.b",
            tree=DIGEST,
            status="succeeded",
            reused=False,
            replay=replay,
            judge=judge,
        ),
        ReplayRecord(measurement="m", unit="m.0.0.b", tree=DIGEST, replay=replay),
        ProposalRecord(slot="c0.i0.s0", result=proposal),
    ]
    for old, record in zip(as_dicts, records, strict=True):
        assert encode_record(record) == encode_record(old)
        assert parse_journal_record(orjson.loads(encode_record(old)), "j:1") == record


def test_an_older_unit_record_without_a_tree_still_reads() -> None:
    replay, _, _ = _results()
    line = {
        "type": "unit",
        "measurement": "m",
        "unit": "m.0.0.b",
        "status": "failed",
        "reused": False,
        "replay": replay.model_dump(mode="json"),
        "judge": None,
    }
    record = parse_journal_record(line, "j:1")
    assert isinstance(record, UnitRecord) and record.tree is None and record.judge is None
    assert record.key is None  # never reused by another run


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ({"type": "checkpoint", "at": 3}, "unknown type 'checkpoint'"),
        ({"unit": "m.0.0.b"}, "unknown type 'None'"),
        ({"type": "unit", "measurement": "m", "unit": "u", "status": "exploded"}, "status"),
        ({"type": "proposal", "slot": "s", "result": {}, "extra": 1}, "proposal record"),
    ],
)
def test_a_journal_line_this_evolane_does_not_know_is_one_clear_error(
    line: dict[str, Any], words: str
) -> None:
    from evolane.messages import JournalRecordError

    with pytest.raises(JournalRecordError) as caught:
        parse_journal_record(line, "runs/r1/journal.jsonl:7")
    message = str(caught.value)
    assert message.startswith("runs/r1/journal.jsonl:7: ") and words in message
    assert "newer or older evolane" in message and "\n" not in message
