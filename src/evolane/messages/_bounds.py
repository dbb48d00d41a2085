"""The boundedness rule of DESIGN §3, checked from each model's JSON Schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_JsonSchema = dict[str, Any]


def unbounded_fields(model: type[BaseModel]) -> list[str]:
    """Paths of the schema nodes of ``model`` that lack a size bound; empty when it is bounded.

    Strings need ``maxLength`` (or an enum/const), arrays ``maxItems``, open objects
    ``maxProperties`` and bounded keys; bytes are refused outright (payloads go to the store).
    """
    schema = model.model_json_schema(mode="serialization")
    problems: list[str] = []
    _walk(schema, schema.get("$defs", {}), model.__name__, problems, set())
    return problems


def _walk(
    node: _JsonSchema, defs: _JsonSchema, path: str, problems: list[str], seen: set[str]
) -> None:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            _walk(defs[name], defs, f"{path}->{name}", problems, seen | {name})
        return
    if "const" in node or "enum" in node:
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for index, branch in enumerate(node.get(key, [])):
            _walk(branch, defs, f"{path}[{key}{index}]", problems, seen)
    kind = node.get("type")
    if kind == "string":
        if node.get("format") == "binary":
            problems.append(f"{path}: bytes field (store payloads and send an ArtifactRef)")
        elif "maxLength" not in node:
            problems.append(f"{path}: string without max_length")
    elif kind == "array":
        if "maxItems" not in node and "prefixItems" not in node:
            problems.append(f"{path}: array without max_length")
        for index, item in enumerate(node.get("prefixItems", [])):
            _walk(item, defs, f"{path}[{index}]", problems, seen)
        if isinstance(node.get("items"), dict):
            _walk(node["items"], defs, f"{path}[]", problems, seen)
    elif kind == "object":
        for name, sub in node.get("properties", {}).items():
            _walk(sub, defs, f"{path}.{name}", problems, seen)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) or extra is True:
            if "maxProperties" not in node:
                problems.append(f"{path}: mapping without max_length")
            keys = node.get("propertyNames", {})
            if "maxLength" not in keys and "enum" not in keys:
                problems.append(f"{path}: mapping keys without max_length")
            if isinstance(extra, dict):
                _walk(extra, defs, f"{path}{{}}", problems, seen)
