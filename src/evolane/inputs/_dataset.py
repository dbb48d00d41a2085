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

from evolane.inputs._cases import SPLITS, Case, Split, case_json, cluster_of, without_answers
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

    The cases are kept as one buffer, `canonical_jsonl` (each case's `case_json` and a
    newline: what the digest hashes and the case files are made of), with where each row
    ends: no object per case but its id. `Case`\ s are built when asked for. Two datasets
    are equal when they have the same path and digest.
    """

    __slots__ = ("_by_id", "_digest", "_ends", "_ids", "_jsonl", "_path", "_splits")

    _jsonl: bytes  # every case's canonical JSON and a newline, in file order
    _ends: array[int]  # where each case's row ends in _jsonl (at its newline)
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
        rows = _Rows()
        for index, case in enumerate(cases, start=1):
            try:
                row = case_json(case)
            except orjson.JSONEncodeError as error:
                raise DatasetError.at(shown, None, f"a case cannot be encoded: {error}") from None
            earlier = rows.add(case.id, case.split, row, index)
            if earlier is not None:
                reason = f"duplicate id {quote(case.id)} (cases {earlier} and {index})"
                raise DatasetError.at(shown, None, reason)
            reason = rows.split_cluster(case, index, "case")
            if reason is not None:
                raise DatasetError.at(shown, None, f"case {index}: {reason}")
        rows.fill(self, shown)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Dataset is immutable (cannot set {name!r})")

    def _row(self, index: int) -> bytes:
        """The canonical JSON of the case at ``index`` in file order."""
        start = self._ends[index - 1] + 1 if index else 0
        return self._jsonl[start : self._ends[index]]

    def _case(self, index: int) -> Case:
        """The case at ``index`` in file order, validated again from its canonical JSON (a
        `Case` is never built unvalidated)."""
        return Case.model_validate_json(self._row(index))

    @property
    def cases(self) -> tuple[Case, ...]:
        """Every case, in file order (built anew on each call)."""
        return tuple(map(self._case, range(len(self._ids))))

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

    def split_rows(self, name: str) -> Iterator[bytes]:
        """The `case_json` of split ``name``'s cases in file order (no case is built)."""
        return map(self._row, self._places(name))

    def by_id(self, case_id: str) -> Case:
        """The case with id ``case_id``; `KeyError` if there is none."""
        return self._case(self._by_id[case_id])

    def rows(self, *, include_answers: bool = True) -> Iterator[tuple[str, bytes]]:
        """Each case's id and `case_json` (without the answers when ``include_answers`` is
        False), in file order, without building a `Case`."""
        for index, case_id in enumerate(self._ids):
            row = self._row(index)
            yield case_id, row if include_answers else without_answers(row)

    def canonical_jsonl(self) -> bytes:
        """The canonical JSONL of the dataset (one `case_json` per line); `digest` hashes it."""
        return self._jsonl

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[Case]:
        return map(self._case, range(len(self._ids)))

    def __contains__(self, case_id: object) -> bool:
        return case_id in self._by_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return self._path == other._path and self._digest == other._digest

    def __hash__(self) -> int:
        return hash((self._path, self._digest))

    def __repr__(self) -> str:
        return f"Dataset(path={self._path!r}, cases={len(self._ids)}, digest={self._digest!r})"


class _Rows:
    """A dataset as it is read: the rows appended to one buffer, each id's place and the
    number it came with (a line, or a case's position) to name a duplicate."""

    def __init__(self) -> None:
        self.jsonl = bytearray()
        self.ends: array[int] = array("q")
        self.places: dict[str, int] = {}
        self.numbers: array[int] = array("q")
        self.splits: dict[str, array[int]] = {name: array("q") for name in SPLITS}
        self.clusters: dict[str, tuple[str, int]] = {}  # cluster -> its first split, number

    def add(self, case_id: str, split: Split, row: bytes, number: int) -> int | None:
        """Append one case; a duplicate id is not added and its first number is returned."""
        earlier = self.places.get(case_id)
        if earlier is not None:
            return self.numbers[earlier]
        place = len(self.ends)
        self.places[case_id] = place
        self.numbers.append(number)
        self.splits[split].append(place)
        self.jsonl += row
        self.jsonl += b"\n"
        self.ends.append(len(self.jsonl) - 1)
        return None

    def split_cluster(self, case: Case, number: int, noun: str = "line") -> str | None:
        """Why ``case`` may not join its cluster (`cluster_of`), None when it may: a cluster's
        cases are not independent, so one in two splits shows the optimizer (train) cases
        the gate (val) decides on, or val cases the test split confirms a choice on (found by
        review: a useless best chosen on val cases whose clusters test shares was published
        8.7% of the time at level 0.05)."""
        cluster = cluster_of(case)
        if cluster is None:
            return None
        split, first = self.clusters.setdefault(cluster, (case.split, number))
        if split == case.split:
            return None
        kind, _, name = cluster.partition(":")
        return (
            f"{case.split} case {quote(case.id)} is in {kind} {quote(name)}, whose case on "
            f"{noun} {first} is a {split} case: a cluster's cases must share one split (they "
            "are not independent, so the optimizer or the gate would see cases the gate or "
            "the test split judges)"
        )

    def fill(self, dataset: Dataset, path: str) -> None:
        """Give ``dataset`` these rows; no rows raise `DatasetError` ``"no cases"``."""
        if not self.ends:
            raise DatasetError.at(path, None, "no cases")
        jsonl = bytes(self.jsonl)
        self.jsonl = bytearray()
        set_ = object.__setattr__
        set_(dataset, "_jsonl", jsonl)
        set_(dataset, "_ends", self.ends)
        set_(dataset, "_ids", tuple(self.places))
        set_(dataset, "_path", path)
        set_(dataset, "_digest", "sha256:" + hashlib.sha256(jsonl).hexdigest())
        set_(dataset, "_by_id", MappingProxyType(self.places))
        set_(dataset, "_splits", MappingProxyType(self.splits))


def require_split(dataset: Dataset, name: Split) -> tuple[Case, ...]:
    """The cases of split ``name``; `DatasetError` ``"<path>: the <name> split is empty"``."""
    cases = dataset.split(name)
    if not cases:
        raise DatasetError.at(dataset.path, None, f"the {name} split is empty")
    return cases


def case_clusters(dataset: Dataset) -> dict[str, str]:
    """Per case id, the cluster it names (`cluster_of`); cases that name none are left out
    (each is a cluster of its own). Cheap for a dataset that names no cluster or session:
    the rows are not parsed."""
    jsonl = dataset.canonical_jsonl()
    if b'"cluster"' not in jsonl and b'"session"' not in jsonl:
        return {}
    found = {}
    for case in dataset:
        cluster = cluster_of(case)
        if cluster is not None:
            found[case.id] = cluster
    return found


def load_dataset(
    path: str | os.PathLike[str],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    clusters_may_span: bool = False,
) -> Dataset:
    """Read and check the JSONL dataset at ``path``; the first problem raises `DatasetError`.
    ``clusters_may_span``: a cluster's cases may lie in two splits (a run or campaign begun
    before that was refused continues on the dataset it began on, rather than stranded)."""
    shown = os.fspath(path)
    data = _read_bounded(shown, max_file_bytes)
    return parse_dataset(
        data, path=shown, max_line_bytes=max_line_bytes, clusters_may_span=clusters_may_span
    )


def parse_dataset(
    data: bytes,
    *,
    path: str = _DEFAULT_PATH,
    max_line_bytes: int = MAX_LINE_BYTES,
    clusters_may_span: bool = False,
) -> Dataset:
    """Check JSONL ``data`` (named ``path`` in messages) as `load_dataset` does for a file."""
    rows = _Rows()
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
        earlier = rows.add(case.id, case.split, row_json, number)
        if earlier is not None:
            _fail(path, number, f"duplicate id {quote(case.id)} (first on line {earlier})")
        reason = None if clusters_may_span else rows.split_cluster(case, number)
        if reason is not None:
            _fail(path, number, reason)
    dataset = Dataset.__new__(Dataset)
    rows.fill(dataset, path)
    return dataset


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
        _fail(path, number, _invalid_json(line, error))
    if not isinstance(row, dict):
        _fail(path, number, f"a row must be a JSON object, got {_json_kind(row)}")
    unknown = [key for key in row if key not in _FIELDS]
    if unknown:
        names = ", ".join(quote(key) for key in sorted(unknown)[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        plural = "s" if len(unknown) > 1 else ""
        _fail(path, number, f"unknown key{plural} {names}{more} (allowed: {', '.join(_FIELDS)})")
    twice = _field_twice(line, row)
    if twice is not None:
        _fail(path, number, f"key {quote(twice)} given twice (JSON keeps only the last)")
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


_NAME_ESCAPE = re.compile(rb"\\u00[4-7]")  # a letter or "_" of a field's name, escaped
_NAMED = re.compile(rb'"(?:' + "|".join(_FIELDS).encode() + rb')"\s*:')  # a field's key


def _field_twice(line: bytes, row: dict[str, Any]) -> str | None:
    """The field ``line`` (parsed as ``row``) sets twice, else None: orjson keeps the last
    value of a repeated key, so ``{"id": "a", "id": "b"}`` was case ``b`` and a row with two
    ``expected_output`` was judged against its second, silently (found by review). Only a
    line with more keys named as fields than its row has (``input`` may hold an ``id``
    too), or a field's name escaped, is parsed again."""
    if len(_NAMED.findall(line)) <= len(row) and (
        b"\\u00" not in line or _NAME_ESCAPE.search(line) is None
    ):
        return None
    import json

    try:
        pairs = json.loads(line, object_pairs_hook=lambda items: items)
    except (ValueError, RecursionError):
        return None  # orjson read it: the check is lost, not the row
    seen: set[str] = set()
    for key, _value in pairs:
        if key in seen:
            return str(key)
        seen.add(key)
    return None


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


def _invalid_json(line: bytes, error: orjson.JSONDecodeError) -> str:
    """Why ``line`` is not JSON: where it is not UTF-8 (orjson says "surrogates not
    allowed" at column 1 for any such byte: a gzip or UTF-16 file read so; found by
    review), else orjson's reason."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"not UTF-8 text (byte 0x{line[bad.start]:02x} at column {bad.start + 1})"
    return f"invalid JSON: {_trim_orjson(str(error))}"


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
