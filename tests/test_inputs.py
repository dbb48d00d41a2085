"""Datasets (DESIGN §8 rows): loading, one-line file:line refusals, the digest, round trips."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolane.inputs import (
    SPLITS,
    Case,
    Dataset,
    DatasetError,
    InputError,
    case_json,
    case_row,
    load_dataset,
    parse_dataset,
    require_split,
)

ROWS = [
    {"id": "t-1", "input": {"q": "2+2"}, "expected_output": 4, "split": "train"},
    {"id": "v-1", "input": [1, "two", None], "metadata": {"family": "a", "n": 1.5}},
    {"id": "v-2", "input": "text", "verification_command": "python check.py {case_file}"},
    {"id": "x-1", "input": None, "expected_output": {"b": [True, False]}, "split": "test"},
]


def jsonl(*rows: object) -> bytes:
    """Rows as JSONL bytes; a ``bytes`` row is written as is."""
    return b"".join((row if isinstance(row, bytes) else orjson.dumps(row)) + b"\n" for row in rows)


def refusal(data: bytes, **limits: int) -> str:
    """The one-line message `parse_dataset` refuses ``data`` with (as file ``d.jsonl``)."""
    with pytest.raises(DatasetError) as caught:
        parse_dataset(data, path="d.jsonl", **limits)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    return message


def test_good_file_loads_in_order_with_lookups(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_bytes(jsonl(*ROWS))
    dataset = load_dataset(path)
    assert dataset.path == str(path)
    assert [case.id for case in dataset.cases] == ["t-1", "v-1", "v-2", "x-1"]
    assert dataset.cases == tuple(Case(**row) for row in ROWS)
    assert [case.id for case in dataset.split("val")] == ["v-1", "v-2"]
    assert dataset.split("val")[0].split == "val"  # the default split
    assert dataset.split_counts == {"train": 1, "val": 2, "test": 1}
    assert dataset.by_id("x-1").expected_output == {"b": [True, False]}
    assert len(dataset) == 4 and "v-2" in dataset and "nope" not in dataset
    assert list(dataset) == list(dataset.cases)
    with pytest.raises(KeyError):
        dataset.by_id("nope")
    with pytest.raises(ValueError, match="unknown split"):
        dataset.split("dev")
    with pytest.raises(AttributeError):
        dataset._cases = ()  # type: ignore[misc]


def test_canonical_round_trip_is_a_fixed_point(tmp_path: Path) -> None:
    first = parse_dataset(jsonl(*ROWS), path="a.jsonl")
    again_path = tmp_path / "canonical.jsonl"
    again_path.write_bytes(first.canonical_jsonl())
    again = load_dataset(again_path)
    assert again.cases == first.cases
    assert again.digest == first.digest
    assert again.canonical_jsonl() == first.canonical_jsonl()


def test_case_json_is_sorted_compact_and_omits_absent_fields() -> None:
    case = Case(id="c", input={"z": 1, "a": {"y": 2, "b": 3}}, metadata={"k": "v"})
    assert case_json(case) == (
        b'{"id":"c","input":{"a":{"b":3,"y":2},"z":1},"metadata":{"k":"v"},"split":"val"}'
    )
    full = Case(id="c", input=1, expected_output=[1], verification_command="true")
    assert orjson.loads(case_json(full)) == {
        "id": "c",
        "input": 1,
        "expected_output": [1],
        "verification_command": "true",
        "split": "val",
    }
    assert orjson.loads(case_json(full, include_answers=False)) == {"id": "c", "input": 1}


def test_null_optional_fields_mean_absent() -> None:
    row = {"id": "c", "input": None, "expected_output": None, "metadata": None}
    dataset = parse_dataset(jsonl(row, {"id": "d", "input": None, "verification_command": None}))
    assert dataset.cases[0] == Case(id="c", input=None)
    assert case_json(dataset.cases[1]) == b'{"id":"d","input":null,"split":"val"}'


def test_bom_crlf_and_blank_lines_are_tolerated() -> None:
    text = b"\xef\xbb\xbf\r\n" + jsonl(*ROWS).replace(b"\n", b"\r\n\n  \t\n")
    assert parse_dataset(text).cases == parse_dataset(jsonl(*ROWS)).cases


def test_digest_is_stable_across_formatting() -> None:
    plain = parse_dataset(jsonl(*ROWS)).digest
    assert plain.startswith("sha256:") and len(plain) == 7 + 64
    pretty = b"".join(
        json.dumps(row, sort_keys=not index % 2, ensure_ascii=bool(index % 3)).encode() + b"\n\n"
        for index, row in enumerate(ROWS)
    )
    assert parse_dataset(pretty, path="other.jsonl").digest == plain
    with_defaults = jsonl(*({"split": "val", **row} for row in ROWS))
    assert parse_dataset(with_defaults).digest == plain


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: [*rows[:-1], {**rows[-1], "input": 1}],
        lambda rows: [*rows[:-1], {**rows[-1], "split": "val"}],
        lambda rows: [*rows[:-1], {**rows[-1], "metadata": {}}],
        lambda rows: [*rows[:-1], {**rows[-1], "id": "x-2"}],
        lambda rows: [*rows[:-1], {**rows[-1], "expected_output": {"b": [True, True]}}],
        lambda rows: [{**rows[0], "input": {"q": "2+2", "": 0}}, *rows[1:]],
        lambda rows: rows[:-1],
        lambda rows: list(reversed(rows)),
        lambda rows: [*rows, {"id": "y", "input": 0}],
    ],
    ids=["input", "split", "metadata", "id", "expected", "nested-key", "drop", "order", "add"],
)
def test_digest_is_sensitive_to_content_and_order(change: object) -> None:
    changed = change(ROWS)  # type: ignore[operator]
    assert parse_dataset(jsonl(*changed)).digest != parse_dataset(jsonl(*ROWS)).digest


GOOD = orjson.dumps({"id": "ok", "input": 1})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": "a", "input": ', "invalid JSON: unexpected end of data at column 22"),
        (b'{"id": "a", "input": 1} x', "invalid JSON: unexpected content after document"),
        (b'{"id": "a", "input": NaN}', "invalid JSON:"),
        (b'{"id": "a", "input": 1e999}', "invalid JSON: number is infinity"),
        (b'{"id": "a", "input": "\xff"}', "not UTF-8 text (byte 0xff at column 23)"),
        (b"\xef\xbb\xbf" + GOOD, "invalid JSON"),
        (b"[1, 2]", "a row must be a JSON object, got an array"),
        (b'"text"', "a row must be a JSON object, got a string"),
        (b"null", "a row must be a JSON object, got null"),
        (b'{"input": 1}', "missing required field 'id'"),
        (b'{"id": "a"}', "missing required field 'input'"),
        (b'{"id": "a", "input": 1, "inputs": 2}', "unknown key 'inputs' (allowed: id, input,"),
        (b'{"id": "a", "input": 1, "z": 0, "y": 0}', "unknown keys 'y', 'z' (allowed:"),
        (b'{"id": "a", "input": 1, "a\\nb": 0}', "unknown key 'a\\nb'"),
        (b'{"id": 7, "input": 1}', "field 'id': should be a valid string (got 7)"),
        (b'{"id": "", "input": 1}', "field 'id': string should have at least 1 character"),
        (b'{"id": "' + b"x" * 129 + b'", "input": 1}', "field 'id': string should have at most"),
        (b'{"id": "a/b", "input": 1}', "field 'id': must not contain '/' (got 'a/b')"),
        (b'{"id": "..", "input": 1}', "field 'id': must not be '..'"),
        (b'{"id": "a\\u0000", "input": 1}', "field 'id': must not contain control characters"),
        (b'{"id": "a\\tb", "input": 1}', "field 'id': must not contain control characters"),
        (b'{"id": "a", "input": 1, "split": "dev"}', "field 'split': should be 'train', 'val'"),
        (b'{"id": "a", "input": 1, "metadata": [1]}', "field 'metadata': should be a valid dict"),
        (b'{"id": "a", "input": 1, "verification_command": 3}', "field 'verification_command'"),
        (
            b'{"id": "a", "input": 1, "verification_command": "check {prompt_file}"}',
            "field 'verification_command': {prompt_file} cannot be used in the verification",
        ),
        (
            b'{"id": "a", "input": 1, "verification_command": "check \'x"}',
            "field 'verification_command': cannot split the command: no closing quotation",
        ),
        (b'{"id": "a", "input": ' + b"[" * 300 + b"]" * 300 + b"}", "field 'input': nested too"),
        (
            b'{"id": "a", "input": 0, "metadata": {"m": ' + b"[" * 253 + b"]" * 253 + b"}}",
            "field 'metadata': nested",
        ),
    ],
)
def test_a_bad_row_is_refused_with_its_line(line: bytes, reason: str) -> None:
    data = jsonl(GOOD, b"", line, orjson.dumps({"id": "later", "input": 1}))
    message = refusal(data)
    assert message.startswith(f"d.jsonl:3: {reason}"), message


def test_deep_but_writable_nesting_is_accepted() -> None:
    deep = b'{"id": "a", "input": ' + b"[" * 200 + b"]" * 200 + b"}"
    assert len(parse_dataset(deep)) == 1


def test_duplicate_id_names_the_earlier_line() -> None:
    data = jsonl({"id": "a", "input": 1}, {"id": "b", "input": 1}, b"", {"id": "a", "input": 2})
    assert refusal(data) == "d.jsonl:4: duplicate id 'a' (first on line 1)"


@pytest.mark.parametrize(
    ("line", "twice"),
    [
        (b'{"id": "a", "id": "b", "input": 1}', "id"),
        (b'{"id": "a", "input": 1, "expected_output": 1, "expected_output": 2}', "expected_output"),
        (b'{"id": "a", "input": 1, "\\u0069nput": 2}', "input"),
    ],
)
def test_a_field_given_twice_is_refused(line: bytes, twice: str) -> None:
    message = refusal(jsonl(GOOD, line))
    assert message == f"d.jsonl:2: key '{twice}' given twice (JSON keeps only the last)"


def test_field_names_repeated_inside_values_are_not_a_repeated_key() -> None:
    row = {"id": "a", "input": {"id": 1, "input": ["input"]}, "metadata": {"id": 2, "x": "\u0041"}}
    assert parse_dataset(jsonl(row)).by_id("a").input == {"id": 1, "input": ["input"]}


def test_the_first_problem_is_reported() -> None:
    data = jsonl(GOOD, {"id": "b", "input": 1, "split": "dev"}, b"{broken")
    assert refusal(data).startswith("d.jsonl:2: field 'split'")


@pytest.mark.parametrize("data", [b"", b"\n\n  \r\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\n\t\n"])
def test_no_cases(data: bytes) -> None:
    assert refusal(data) == "d.jsonl: no cases"


def test_line_and_file_size_bounds() -> None:
    long_row = orjson.dumps({"id": "a", "input": "x" * 100})
    assert refusal(jsonl(GOOD, long_row), max_line_bytes=64) == (
        f"d.jsonl:2: line is {len(long_row)} bytes, over the 64 bytes limit"
    )
    assert len(parse_dataset(jsonl(GOOD, long_row), max_line_bytes=len(long_row))) == 2


def test_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(DatasetError) as caught:
        load_dataset(missing)
    assert str(caught.value) == f"{missing}: cannot read: no such file or directory"
    with pytest.raises(DatasetError) as caught:
        load_dataset(tmp_path)
    assert str(caught.value) == f"{tmp_path}: cannot read: is a directory"
    big = tmp_path / "big.jsonl"
    big.write_bytes(jsonl(*ROWS))
    with pytest.raises(DatasetError) as caught:
        load_dataset(big, max_file_bytes=100)
    assert (
        str(caught.value) == f"{big}: file is {big.stat().st_size} bytes, over the 100 bytes limit"
    )
    with pytest.raises(DatasetError) as caught:
        load_dataset("/dev/zero", max_file_bytes=1000)  # no size to stat: the read is bounded
    assert str(caught.value) == "/dev/zero: file is over the 1000 bytes limit"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl(GOOD, b"{"))
    with pytest.raises(DatasetError) as caught:
        load_dataset(str(bad))
    assert str(caught.value).startswith(f"{bad}:2: invalid JSON")
    assert caught.value.path == str(bad) and caught.value.line == 2


def test_error_attributes_and_pickling() -> None:
    with pytest.raises(DatasetError) as caught:
        parse_dataset(jsonl(GOOD, GOOD), path="p.jsonl")
    error = caught.value
    assert isinstance(error, InputError) and isinstance(error, ValueError)
    assert (error.path, error.line, error.reason) == (
        "p.jsonl",
        2,
        "duplicate id 'ok' (first on line 1)",
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.path, copy.line, copy.reason) == (
        str(error),
        error.path,
        error.line,
        error.reason,
    )


def test_a_path_with_a_newline_still_gives_one_line() -> None:
    with pytest.raises(DatasetError) as caught:
        parse_dataset(b"", path="odd\nname.jsonl")
    assert str(caught.value) == "odd name.jsonl: no cases"


def test_require_split() -> None:
    dataset = parse_dataset(jsonl({"id": "a", "input": 1, "split": "train"}), path="d.jsonl")
    assert require_split(dataset, "train") == dataset.cases
    with pytest.raises(DatasetError) as caught:
        require_split(dataset, "val")
    assert str(caught.value) == "d.jsonl: the val split is empty"


def test_dataset_built_from_cases() -> None:
    cases = [Case(**row) for row in ROWS]
    dataset = Dataset(cases, path="mem")
    assert dataset == parse_dataset(jsonl(*ROWS), path="mem")
    assert hash(dataset) == hash(parse_dataset(jsonl(*ROWS), path="mem"))
    assert dataset != parse_dataset(jsonl(*ROWS), path="elsewhere")
    assert "cases=4" in repr(dataset)
    with pytest.raises(DatasetError, match=r"^mem: duplicate id 'v-1' \(cases 2 and 5\)$"):
        Dataset([*cases, cases[1]], path="mem")
    with pytest.raises(DatasetError, match=r"^mem: no cases$"):
        Dataset([], path="mem")


def test_case_validates_on_construction() -> None:
    with pytest.raises(ValueError):
        Case(id="a", input=float("nan"))
    with pytest.raises(ValueError):
        Case(id="a/b", input=1)
    with pytest.raises(ValueError):
        Case(id="a", input=1, verification_command="run {bogus}")
    case = Case(id="a", input=1, verification_command="check --dir={workspace} {case_file}")
    template = case.verification_template()
    assert template is not None and template.placeholders == {"workspace", "case_file"}
    assert Case(id="a", input=1).verification_template() is None


# --- property tests -------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
_ids = st.text(
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/"),
    min_size=1,
    max_size=24,
).filter(lambda text: text not in (".", ".."))
_rows = st.fixed_dictionaries(
    {"id": _ids, "input": _json},
    optional={
        "expected_output": _json.filter(lambda value: value is not None),
        "verification_command": st.sampled_from(["true", "check {case_file} --ws={workspace}"]),
        "split": st.sampled_from(SPLITS),
        "metadata": st.dictionaries(st.text(max_size=6), _json, max_size=3),
    },
)


def _write(rows: list[dict[str, object]], style: int) -> bytes:
    """JSONL in one of several equivalent spellings."""
    if style == 0:
        return jsonl(*rows)
    if style == 1:
        lines = [json.dumps(row, ensure_ascii=False, sort_keys=True) for row in rows]
        return ("\ufeff" + "\r\n\n".join(lines)).encode()
    return "".join(f"  {json.dumps(row, indent=None)}\t\n\n" for row in rows).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_rows, min_size=1, max_size=6, unique_by=lambda row: row["id"]), st.integers(0, 2))
def test_random_valid_rows_load_back_equal(rows: list[dict[str, object]], style: int) -> None:
    dataset = parse_dataset(_write(rows, style), path="h.jsonl")
    assert dataset.cases == tuple(Case(**row) for row in rows)  # type: ignore[arg-type]
    assert [case_row(case) for case in dataset.cases] == [{"split": "val", **row} for row in rows]
    again = parse_dataset(dataset.canonical_jsonl(), path="h.jsonl")
    assert again == dataset and again.cases == dataset.cases
    # Kept encoded: the rows given without a `Case` built are those of the cases.
    for answers in (True, False):
        assert list(dataset.rows(include_answers=answers)) == [
            (case.id, case_json(case, include_answers=answers)) for case in dataset.cases
        ]
    for name in SPLITS:
        assert dataset.split_ids(name) == tuple(case.id for case in dataset.split(name))
        assert dataset.split_counts[name] == len(dataset.split(name))
    assert all(dataset.by_id(case.id) == case for case in dataset.cases)


_keys = st.sampled_from(["id", "input", "expected_output", "verification_command", "split"])
_near_rows = st.dictionaries(_keys | st.sampled_from(["metadata", "x"]), _json, max_size=5)
_garbage_line = (
    st.binary(max_size=40)
    | st.text(max_size=40).map(str.encode)
    | _json.map(orjson.dumps)
    | _near_rows.map(orjson.dumps)
    | _rows.map(orjson.dumps)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_garbage_line, max_size=6))
def test_random_garbage_only_ever_raises_dataset_error(lines: list[bytes]) -> None:
    try:
        dataset = parse_dataset(b"\n".join(lines), path="g.jsonl")
    except DatasetError as error:
        message = str(error)
        assert message.startswith("g.jsonl") and "\n" not in message and "\r" not in message
        assert error.line is None or 1 <= error.line <= max(1, len(b"\n".join(lines).split(b"\n")))
    else:
        assert len(dataset) >= 1
