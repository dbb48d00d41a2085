"""Loading a JSONL dataset (DESIGN §8) into an immutable `Dataset`, refusing bad rows by line.

Every refusal is a `DatasetError` whose message is one line naming the file and, where there
is one, the 1-based line of the first problem.
"""

from __future__ import annotations

import hashlib
import os
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NoReturn

import orjson
from pydantic import ValidationError

from evolane.inputs._cases import SPLITS, Case, Split, case_json, without_answers
from evolane.inputs._errors import DatasetError, InputError, quote
from evolane.store import read_at_most

MAX_FILE_BYTES = 256 * 1024 * 1024
"""A dataset file larger than this is refused before it is read."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""A dataset line longer than this is refused."""

_BOM = b"\xef\xbb\xbf"
_JSON_SPACE = b" \t\r\n"
_FIELDS = tuple(Case.model_fields)
_REQUIRED = ("id", "input")
_ORJSON_WHERE = re.compile(r": line \d+ column (\d+) \(char \d+\)$")
_DEFAULT_PATH = "<dataset>"


class Dataset:
    r"""An immutable, loaded dataset: its cases in file order, looked up by id and by split.

    Each case is kept as its canonical JSON (`case_json`: what the digest hashes and the
    case files are made of), about a tenth of a validated `Case`'s memory; `Case`\ s are
    built when asked for. Two datasets are equal when they have the same path and digest.
    """

    __slots__ = ("_by_id", "_digest", "_ids", "_path", "_rows", "_splits")

    _rows: tuple[bytes, ...]  # each case's canonical JSON, in file order
    _ids: tuple[str, ...]
    _path: str
    _digest: str
    _by_id: Mapping[str, int]  # a case's place in file order
    _splits: Mapping[str, array[int]]  # each split's places, in file order

    def __init__(
        self, cases: Iterable[Case], *, path: str | os.PathLike[str] = _DEFAULT_PATH
    ) -> None:
        """Hold ``cases`` (in order); duplicate ids or no cases raise `DatasetError`."""
        shown = os.fspath(path)
        ordered = tuple(cases)
        seen: dict[str, int] = {}
        for index, case in enumerate(ordered, start=1):
            if case.id in seen:
                raise DatasetError.at(
                    shown,
                    None,
                    f"duplicate id {quote(case.id)} (cases {seen[case.id]} and {index})",
                )
            seen[case.id] = index
        try:
            rows = [_kept(case_json(case)) for case in ordered]
        except orjson.JSONEncodeError as error:
            raise DatasetError.at(shown, None, f"a case cannot be encoded: {error}") from None
        hasher = hashlib.sha256()
        for row in rows:
            hasher.update(row + b"\n")
        kept = [(case.id, case.split, row) for case, row in zip(ordered, rows, strict=True)]
        self._build(kept, "sha256:" + hasher.hexdigest(), shown)

    @classmethod
    def _trusted(cls, kept: list[tuple[str, Split, bytes]], digest: str, path: str) -> Dataset:
        """A dataset from rows the loader has checked (id, split, canonical JSON), and the
        `digest` it took as it read them."""
        dataset = cls.__new__(cls)
        dataset._build(kept, digest, path)
        return dataset

    def _build(self, kept: list[tuple[str, Split, bytes]], digest: str, path: str) -> None:
        if not kept:
            raise DatasetError.at(path, None, "no cases")
        splits: dict[str, array[int]] = {name: array("q") for name in SPLITS}
        for index, (_, split, _) in enumerate(kept):
            splits[split].append(index)
        set_ = object.__setattr__
        set_(self, "_rows", tuple(row for _, _, row in kept))
        set_(self, "_ids", tuple(case_id for case_id, _, _ in kept))
        set_(self, "_path", path)
        set_(self, "_digest", digest)
        set_(self, "_by_id", MappingProxyType({case_id: i for i, case_id in enumerate(self._ids)}))
        set_(self, "_splits", MappingProxyType(splits))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Dataset is immutable (cannot set {name!r})")

    def _case(self, index: int) -> Case:
        """The case at ``index`` in file order, validated again from its canonical JSON (a
        `Case` is never built unvalidated)."""
        return Case.model_validate_json(self._rows[index])

    @property
    def cases(self) -> tuple[Case, ...]:
        """Every case, in file order (built anew on each call)."""
        return tuple(map(self._case, range(len(self._rows))))

    @property
    def places(self) -> Mapping[str, int]:
        """Each case's place in file order, by id (read-only)."""
        return self._by_id

    @property
    def path(self) -> str:
        """The path the dataset was loaded from, as given (used in error messages)."""
        return self._path

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of `canonical_jsonl`: a fingerprint of the content and its order."""
        return self._digest

    @property
    def split_counts(self) -> Mapping[str, int]:
        """The number of cases in each split (every split is listed, possibly with 0)."""
        return {name: len(places) for name, places in self._splits.items()}

    def _places(self, name: str) -> array[int]:
        try:
            return self._splits[name]
        except KeyError:
            raise ValueError(f"unknown split {name!r} (expected one of {SPLITS})") from None

    def split(self, name: str) -> tuple[Case, ...]:
        """The cases of split ``name`` (``train``, ``val`` or ``test``) in file order."""
        return tuple(map(self._case, self._places(name)))

    def split_ids(self, name: str) -> tuple[str, ...]:
        """The ids of split ``name``'s cases in file order (no case is built)."""
        return tuple(self._ids[index] for index in self._places(name))

    def by_id(self, case_id: str) -> Case:
        """The case with id ``case_id``; `KeyError` if there is none."""
        return self._case(self._by_id[case_id])

    def rows(self, *, include_answers: bool = True) -> Iterator[tuple[str, bytes]]:
        """Each case's id and `case_json` (without the answers when ``include_answers`` is
        False), in file order, without building a `Case`."""
        for case_id, row in zip(self._ids, self._rows, strict=True):
            yield case_id, row if include_answers else without_answers(row)

    def canonical_jsonl(self) -> bytes:
        """The canonical JSONL of the dataset (one `case_json` per line); `digest` hashes it."""
        return b"".join(row + b"\n" for row in self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Case]:
        return map(self._case, range(len(self._rows)))

    def __contains__(self, case_id: object) -> bool:
        return case_id in self._by_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return self._path == other._path and self._digest == other._digest

    def __hash__(self) -> int:
        return hash((self._path, self._digest))

    def __repr__(self) -> str:
        return f"Dataset(path={self._path!r}, cases={len(self._rows)}, digest={self._digest!r})"


def _kept(row: bytes) -> bytes:
    """A copy of an orjson output of its own size (orjson's own buffer holds ~4 KiB)."""
    return memoryview(row).tobytes()


def require_split(dataset: Dataset, name: Split) -> tuple[Case, ...]:
    """The cases of split ``name``; `DatasetError` ``"<path>: the <name> split is empty"``."""
    cases = dataset.split(name)
    if not cases:
        raise DatasetError.at(dataset.path, None, f"the {name} split is empty")
    return cases


def load_dataset(
    path: str | os.PathLike[str],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Dataset:
    """Read and check the JSONL dataset at ``path``; the first problem raises `DatasetError`."""
    shown = os.fspath(path)
    return parse_dataset(
        _read_bounded(shown, max_file_bytes), path=shown, max_line_bytes=max_line_bytes
    )


def parse_dataset(
    data: bytes, *, path: str = _DEFAULT_PATH, max_line_bytes: int = MAX_LINE_BYTES
) -> Dataset:
    """Check JSONL ``data`` (named ``path`` in messages) as `load_dataset` does for a file."""
    kept: list[tuple[str, Split, bytes]] = []
    hasher = hashlib.sha256()  # the digest of `canonical_jsonl`, taken as the rows are read
    seen: dict[str, int] = {}
    start = len(_BOM) if data.startswith(_BOM) else 0
    for number, first, end in _line_spans(data, start):
        if end - first > max_line_bytes:
            _fail(
                path, number, f"line is {end - first} bytes, over the {_size(max_line_bytes)} limit"
            )
        line = data[first:end]
        if not line.strip(_JSON_SPACE):
            continue
        case, row_json = _parse_row(line, path, number)
        earlier = seen.get(case.id)
        if earlier is not None:
            _fail(path, number, f"duplicate id {quote(case.id)} (first on line {earlier})")
        seen[case.id] = number
        kept.append((case.id, case.split, _kept(row_json)))
        hasher.update(row_json + b"\n")
    if not kept:
        _fail(path, None, "no cases")
    return Dataset._trusted(kept, "sha256:" + hasher.hexdigest(), path)


def _read_bounded(path: str, limit: int) -> bytes:
    """The bytes of the file at ``path``, refusing one larger than ``limit``."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                _fail(path, None, f"file is {size} bytes, over the {_size(limit)} limit")
            data = read_at_most(handle, limit)
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        _fail(path, None, f"cannot read: {reason[:1].lower()}{reason[1:]}")
    if len(data) > limit:
        _fail(path, None, f"file is over the {_size(limit)} limit")
    return data


def _line_spans(data: bytes, start: int) -> Iterator[tuple[int, int, int]]:
    """``(line number, start, end)`` of every line of ``data`` (the newline excluded)."""
    number = 0
    while start < len(data):
        number += 1
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield number, start, end
        start = end + 1


def _parse_row(line: bytes, path: str, number: int) -> tuple[Case, bytes]:
    """The `Case` of one non-blank line and its canonical JSON; any problem raises."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        _fail(path, number, f"invalid JSON: {_trim_orjson(str(error))}")
    if not isinstance(row, dict):
        _fail(path, number, f"a row must be a JSON object, got {_json_kind(row)}")
    unknown = [key for key in row if key not in _FIELDS]
    if unknown:
        names = ", ".join(quote(key) for key in sorted(unknown)[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        plural = "s" if len(unknown) > 1 else ""
        _fail(path, number, f"unknown key{plural} {names}{more} (allowed: {', '.join(_FIELDS)})")
    for field in _REQUIRED:
        if field not in row:
            _fail(path, number, f"missing required field {field!r}")
    try:
        case = Case(**row)
    except ValidationError as error:
        _fail(path, number, _describe(error))
    try:
        return case, case_json(case)
    except orjson.JSONEncodeError:
        _fail(path, number, f"field {_too_deep(row)!r}: nested too deeply (about 250 levels)")


def _describe(error: ValidationError) -> str:
    """One line for the first problem pydantic found: the field, what is wrong, the value."""
    first = error.errors(include_url=False)[0]
    field = str(first["loc"][0]) if first["loc"] else "row"
    if first["type"] == "recursion_depth_exceeded":
        return f"field {field!r}: nested too deeply (about 250 levels)"
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, InputError):
        reason = getattr(cause, "reason", None) or cause.message
        return f"field {field!r}: {reason}"
    message = str(first["msg"]).removeprefix("Value error, ")
    if message.startswith("Input should be"):  # "input" would read as the field of that name
        message = "should be" + message.removeprefix("Input should be")
    message = message[:1].lower() + message[1:]
    value = first.get("input")
    if isinstance(value, str | int | float | bool) or value is None:
        return f"field {field!r}: {message} (got {quote(value)})"
    return f"field {field!r}: {message} (got {_json_kind(value)})"


def _too_deep(row: dict[str, Any]) -> str:
    """The first field of ``row`` that orjson cannot write (nesting beyond its limit)."""
    for field, value in row.items():
        try:
            orjson.dumps({field: value})
        except orjson.JSONEncodeError:
            return field
    return "row"


def _json_kind(value: object) -> str:
    """The JSON type name of a parsed value, with an article."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return "a number"


def _trim_orjson(message: str) -> str:
    """orjson's message without its in-row line number, bounded in length."""
    message = _ORJSON_WHERE.sub(r" at column \1", message)
    return message if len(message) <= 200 else message[:197] + "..."


def _size(limit: int) -> str:
    """A byte count as ``N MiB`` when it is a whole number of MiB, else ``N bytes``."""
    mib = 1024 * 1024
    return f"{limit // mib} MiB" if limit % mib == 0 and limit else f"{limit} bytes"


def _fail(path: str, line: int | None, reason: str) -> NoReturn:
    raise DatasetError.at(path, line, reason)
