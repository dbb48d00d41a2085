"""Evaluation cases held by the target (`evolane.campaign._leaks`): a val or test case found
in any file of it is refused by file, line and case; train cases and look-alikes are not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolane.campaign import _leaks
from evolane.campaign._leaks import check_target_copies_no_trajectory, check_target_holds_no_cases
from evolane.inputs import InputError, parse_dataset

ROWS = [
    {"id": "t1", "input": "train question", "expected_output": "a", "split": "train"},
    {"id": "v1", "input": {"q": "val question", "k": [1, 2]}, "expected_output": "b"},
    {"id": "v2", "input": "judged only", "split": "val"},
    {"id": "s1", "input": "test question", "expected_output": {"x": 1}, "split": "test"},
]
DATASET = parse_dataset("".join(json.dumps(row) + "\n" for row in ROWS).encode())


def _target(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "target"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _refusal(target: Path) -> str:
    with pytest.raises(InputError) as caught:
        check_target_holds_no_cases(target, DATASET)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--target {target}: ")
    return message


def test_a_copied_dataset_is_refused_at_its_first_held_out_line(tmp_path: Path) -> None:
    lines = [json.dumps(row) for row in ROWS]
    target = _target(tmp_path, {"data/cases.jsonl": "\n".join(lines) + "\n", "a.md": "hi\n"})
    message = _refusal(target)
    assert "data/cases.jsonl:2 holds val case 'v1'" in message
    assert "(and 2 more val/test cases)" in message


def test_a_reformatted_row_among_text_is_found_by_its_line(tmp_path: Path) -> None:
    row = '    { "expected_output": {"x": 1},  "input" : "test question", "why": "few-shot" }'
    target = _target(tmp_path, {"prompts/system.md": f"# Role\n\nSolve it.\n{row}\nThanks\n"})
    message = _refusal(target)
    assert "prompts/system.md:4 holds test case 's1': its input and expected output;" in message


def test_rows_nested_in_one_json_document_are_found(tmp_path: Path) -> None:
    cases = {"suite": {"cases": [{"input": "judged only"}, {"input": "other"}]}}
    target = _target(tmp_path, {"fixtures.json": json.dumps(cases, indent=2)})
    assert "fixtures.json holds val case 'v2'" in _refusal(target)


def test_rows_on_their_own_lines_of_a_document_over_the_cap_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_leaks, "MAX_DOCUMENT_BYTES", 16)
    text = "[\n" + json.dumps({"input": "test question", "expected_output": {"x": 1}}) + "\n]\n"
    target = _target(tmp_path, {"big.json": text})
    assert "big.json:2 holds test case 's1'" in _refusal(target)


def test_a_single_file_target_is_checked(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text('{"input": "judged only"}\n')
    message = _refusal(prompt)
    assert "prompt.txt:1 holds val case 'v2': its input; every candidate" in message  # no answer


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(ROWS[0]),  # a train case: the optimizer's to see
        '{"input": "test question", "expected_output": {"x": 2}}',  # another answer
        '{"input": "judged only", "expected_output": "b"}',  # an answer v2 never had
        '{"prompt": "test question", "expected_output": {"x": 1}}',  # no input key
        '{"input": "test question", "expected_output": {"x": 1}',  # not JSON
        "input: test question\nexpected_output: {x: 1}\n",  # another format: not seen
    ],
)
def test_train_cases_and_look_alikes_pass(tmp_path: Path, text: str) -> None:
    check_target_holds_no_cases(_target(tmp_path, {"notes.jsonl": text + "\n"}), DATASET)


def test_version_control_metadata_is_not_read(tmp_path: Path) -> None:
    row = json.dumps(ROWS[3])
    check_target_holds_no_cases(_target(tmp_path, {".git/objects/x": row}), DATASET)


def test_a_copy_of_a_trajectory_file_under_another_name_is_refused(tmp_path: Path) -> None:
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"messages": []}\n')
    target = _target(tmp_path, {"logs/old.txt": traces.read_text(), "b.txt": "other\n"})
    with pytest.raises(InputError, match=r"logs/old.txt is a copy of --from-trajectory"):
        check_target_copies_no_trajectory(target, [str(traces)])
    (target / "logs" / "old.txt").write_text('{"messages": [1]}\n')  # same size, not a copy
    check_target_copies_no_trajectory(target, [str(traces)])


def test_lines_are_counted_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_leaks, "BLOCK_BYTES", 64)
    row = json.dumps({"input": "test question", "expected_output": {"x": 1}})
    text = "".join(f"line {n} of some filler text\n" for n in range(1, 50)) + row + "\n"
    text += '{"input": "judged only"}\n'
    message = _refusal(_target(tmp_path, {"log.txt": text}))
    assert "log.txt:50 holds test case 's1'" in message and "(and 1 more val/test case)" in message


def test_an_empty_trajectory_file_makes_no_empty_target_file_a_copy(tmp_path: Path) -> None:
    """Found by review: an empty session log among the trajectories (an agent's aborted
    session) refused every target holding an empty file (``__init__.py``, ``.gitkeep``)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text('{"messages": []}\n')
    (logs / "aborted.jsonl").write_text("")
    (logs / "blank.jsonl").write_text("\n\n")
    target = _target(tmp_path, {"pkg/__init__.py": "", ".gitkeep": "\n\n", "x.md": "rules\n"})
    files = [str(path) for path in sorted(logs.iterdir())]
    check_target_copies_no_trajectory(target, files)
    (target / "a.jsonl").write_text('{"messages": []}\n')  # a real copy is still refused
    with pytest.raises(InputError, match=r"a.jsonl is a copy of --from-trajectory .*a.jsonl"):
        check_target_copies_no_trajectory(target, files)


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [  # a row pasted into a list keeps its comma; into code, what assigns it
        ("few_shot.py", "EXAMPLES = [\n    {row},\n    {row2},\n]\n", "few_shot.py:2"),
        ("cases.js", "const first = {row};\n", "cases.js:1"),
        ("big.json", "[\n{row},\n{row2}\n]\n", "big.json:2"),
        ("bom.jsonl", "\ufeff{row}\n", "bom.jsonl:1"),
    ],
)
def test_a_row_with_a_comma_or_code_around_it_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str, where: str
) -> None:
    """Found by review: only a line that was an object alone was read, so rows pasted into
    a Python list (each but the last with its comma), a JSON array over the document cap
    (one row a line) or after a BOM were missed."""
    monkeypatch.setattr(_leaks, "MAX_DOCUMENT_BYTES", 16)  # big.json: line by line
    row = json.dumps({"input": "test question", "expected_output": {"x": 1}})
    row2 = json.dumps({"input": "judged only"})
    target = _target(tmp_path, {name: text.replace("{row}", row).replace("{row2}", row2)})
    assert f"{where} holds test case 's1'" in _refusal(target)


def test_a_document_of_more_values_than_the_cap_is_not_parsed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a document under the byte cap was parsed whole whatever it held, and
    60 MiB of ``{},`` (one ``"input"`` among them) took 2 GiB; its values are capped now,
    so memory stays within the cap's objects (rows on lines of their own are still read)."""
    import tracemalloc

    monkeypatch.setattr(_leaks, "MAX_OBJECTS", 1000)
    monkeypatch.setattr(_leaks, "BLOCK_BYTES", 1 << 16)  # read() allocates a whole block
    text = '[{"input": 1},\n' + "{}," * 100_000 + "{}]\n"
    target = _target(tmp_path, {"big.json": text})
    tracemalloc.start()
    try:
        check_target_holds_no_cases(target, DATASET)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(text), peak  # the file's bytes, not 100,000 dicts (6.4 MB)
    row = json.dumps({"input": "judged only"})
    (target / "big.json").write_text(text.replace('{"input": 1}', row))
    assert "big.json:1 holds val case 'v2'" in _refusal(target)


def test_a_json_document_after_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Found by review: a pretty-printed JSON file starting with a UTF-8 BOM (as Windows
    tools write it) was not taken for a document, so the rows in it passed."""
    text = "\ufeff" + json.dumps([{"input": "judged only"}], indent=2)
    assert "f.json holds val case 'v2'" in _refusal(_target(tmp_path, {"f.json": text}))
