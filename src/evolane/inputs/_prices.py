"""Prices: a table of dollars per million tokens per model (``--prices FILE``, YAML or JSON)
and the cost of a usage document under it.

A usage document is what a command writes to ``usage.json`` (or ``$EVOLANE_USAGE_FILE``) and
what a built-in model backend returns: ``{"tokens", "cost_usd"}``, or ``{"model",
"input_tokens", "output_tokens", "cached_input_tokens", "cache_write_tokens"}``, or both.
``input_tokens`` counts every input token; ``cached_input_tokens`` and ``cache_write_tokens``
are the parts of them read from and written to the provider's prompt cache. ``"partial":
true`` says some of the spend is not counted in the document (a request whose answer or usage
never came): such a document is never complete, whatever else it says. Where the table
prices the model, its cost wins over a ``cost_usd`` the command wrote (the table in force is
frozen into run.json, so a report's dollars can be computed again)."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field, ValidationError

from evolane.inputs._errors import InputError, one_line, quote
from evolane.messages import Name, Record
from evolane.store import BlobTooLargeError, NotRegularFileError, read_regular_file

MAX_PRICES_BYTES = 1 << 20
"""Bytes read of a price file."""
MAX_PRICED_MODELS = 512
PER = 1_000_000.0
"""Prices are dollars per this many tokens."""


class ModelPrice(Record):
    """Dollars per million tokens of one model; a cache price unset is the input price."""

    input: float = Field(ge=0, le=1e6)
    output: float = Field(ge=0, le=1e6)
    cache_read: float | None = Field(default=None, ge=0, le=1e6)
    cache_write: float | None = Field(default=None, ge=0, le=1e6)


class PriceTable(Record):
    """The prices in force for a run, by model name (exact match)."""

    models: dict[Name, ModelPrice] = Field(default_factory=dict, max_length=MAX_PRICED_MODELS)

    def get(self, model: str | None) -> ModelPrice | None:
        """The price of ``model`` (None: not priced)."""
        return self.models.get(model) if model else None


@dataclass(frozen=True)
class UsageReading:
    """A usage document read: tokens and dollars (None where unknown), the model it names,
    whether a price was missing for it, whether the answer came from a cache, and whether the
    document says some spend is not counted in it (``partial``)."""

    tokens: float | None
    cost_usd: float | None
    model: str | None = None
    unpriced: bool = False
    cached: bool = False
    partial: bool = False

    @property
    def complete(self) -> bool:
        """Both tokens and dollars are known, and nothing is left uncounted (not partial)."""
        return self.tokens is not None and self.cost_usd is not None and not self.partial


def _count(doc: dict[str, Any], key: str) -> float | None:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def read_usage_document(doc: dict[str, Any], prices: PriceTable | None) -> UsageReading:
    """The tokens and dollars of ``doc`` under ``prices`` (see the module docstring)."""
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    cached = doc.get("cached") is True
    inputs, outputs = _count(doc, "input_tokens"), _count(doc, "output_tokens")
    tokens = _count(doc, "tokens")
    if tokens is None and inputs is not None and outputs is not None:
        tokens = inputs + outputs
    cost = _count(doc, "cost_usd")
    price = prices.get(model) if prices is not None else None
    if price is not None and inputs is not None and outputs is not None:
        cost = priced_cost(
            price, inputs, outputs, _count(doc, "cached_input_tokens") or 0.0,
            _count(doc, "cache_write_tokens") or 0.0,
        )  # fmt: skip
    unpriced = model is not None and price is None and cost is None
    partial = doc.get("partial") is True
    return UsageReading(tokens, cost, model[:128] if model else None, unpriced, cached, partial)


def priced_cost(
    price: ModelPrice, inputs: float, outputs: float, cache_read: float, cache_write: float
) -> float:
    """Dollars for these token counts (cache reads and writes are parts of ``inputs``)."""
    cache_read, cache_write = min(cache_read, inputs), min(cache_write, inputs)
    plain = max(0.0, inputs - cache_read - cache_write)
    read_price = price.cache_read if price.cache_read is not None else price.input
    write_price = price.cache_write if price.cache_write is not None else price.input
    total = plain * price.input + cache_read * read_price + cache_write * write_price
    return (total + outputs * price.output) / PER


def load_prices(path: str | Path) -> PriceTable:
    """The price table in ``path`` (``.yaml``/``.yml`` as YAML, else JSON): either
    ``{"models": {name: price}}`` or ``{name: price}``. Bad input: `InputError` naming it."""
    where = f"--prices {path}"
    try:  # a FIFO with no writer is never waited on
        data = read_regular_file(path, MAX_PRICES_BYTES, follow_symlinks=True)
    except NotRegularFileError:
        raise InputError(f"{where}: not a regular file") from None
    except BlobTooLargeError:
        raise InputError(f"{where}: over {MAX_PRICES_BYTES} bytes") from None
    except OSError as error:
        raise InputError(f"{where}: {error.strerror or error}") from None
    loaded = _parse(data, str(path))
    if isinstance(loaded, dict) and set(loaded) == {"models"}:
        loaded = loaded["models"]
    if not isinstance(loaded, dict):
        raise InputError(f"{where}: expected a mapping of model name to prices")
    try:
        return PriceTable(models=loaded)
    except ValidationError as error:
        first = error.errors()[0]
        place = ".".join(str(part) for part in first["loc"][1:])
        raise InputError(f"{where}: {place}: {first['msg']}") from None


def _parse(data: bytes, path: str) -> Any:
    where = f"--prices {path}"
    if not path.lower().endswith((".yaml", ".yml")):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as error:
            raise InputError(f"{where}: not JSON ({error})") from None
    import yaml  # only for a YAML price file

    loader, refused = _strict_yaml()
    try:
        return yaml.load(data.decode("utf-8"), Loader=loader)  # a SafeLoader
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        mark = getattr(error, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        if isinstance(error, refused):
            raise InputError(f"{where}{line}: {error.problem}") from None
        raise InputError(f"{where}{line}: not YAML ({one_line(str(error))})") from None
    except RecursionError:  # the depth bound keeps nesting shallow; this is a backstop
        raise InputError(f"{where}: nested too deeply") from None


MAX_YAML_DEPTH = 32
"""Levels of nested collections a YAML price file may have (it needs three)."""
MAX_NUMBER_CHARS = 64
"""Characters of one YAML integer: longer ones are refused, never converted."""
_STRICT: tuple[Any, type[Exception]] | None = None


def _strict_yaml() -> tuple[Any, type[Exception]]:
    """(loader, error): a ``yaml.SafeLoader`` that refuses duplicate keys, nesting past
    `MAX_YAML_DEPTH` and integers longer than `MAX_NUMBER_CHARS`, each with an error of the
    returned type marked at its line. Built on first use (YAML is imported only then)."""
    global _STRICT
    if _STRICT is None:
        _STRICT = _build_strict_yaml()
    return _STRICT


def _build_strict_yaml() -> tuple[Any, type[Exception]]:
    import yaml

    class Refused(yaml.MarkedYAMLError):
        """A price file the strict loader refuses; ``problem`` says why."""

    class StrictLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > MAX_YAML_DEPTH:
                    mark = self.peek_event().start_mark
                    why = f"nested over {MAX_YAML_DEPTH} levels deep"
                    raise Refused(problem=why, problem_mark=mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in getattr(node, "value", ()):
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merged keys may be overridden: that is what merging is for
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # refused as such by the base class
                if key in seen:
                    why = f"duplicate key {quote(key)}"
                    raise Refused(problem=why, problem_mark=key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            text = self.construct_scalar(node)
            if len(text) > MAX_NUMBER_CHARS:
                why = f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})"
                raise Refused(problem=why, problem_mark=node.start_mark)
            return super().construct_yaml_int(node)

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    return StrictLoader, Refused
