"""Messages: bounded by schema, maximal instances fit MAX_MESSAGE_BYTES, always validated."""

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
    MAX_MESSAGE_BYTES,
    ArtifactRef,
    Message,
    Record,
    message_classes,
    message_schemas,
    unbounded_fields,
)


def _import_everything() -> None:
    for module in pkgutil.walk_packages(evolane.__path__, "evolane."):
        if not module.name.endswith(".__main__"):  # importing those would run a CLI
            importlib.import_module(module.name)


_import_everything()
ALL_MESSAGES = list(message_classes().values())
# Characters whose JSON encoding is the largest per character (escapes, multi-byte UTF-8).
HEAVY_CHARS = st.sampled_from(["a", "\x00", '"', "\\", "é", "\u2028", "\U0001f600"])


def test_there_are_messages_to_check() -> None:
    assert {"ping", "pong", "stress.work"} <= set(message_classes())


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.__name__)
def test_every_message_class_is_bounded(cls: type[Message]) -> None:
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
        return [_maximal(node["items"], defs, draw) for _ in range(node["maxItems"])]
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
