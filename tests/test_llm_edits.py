"""Edits in a model's answer: parsed in one documented format, applied inside the workdir
only, all or none, and a refused edit is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolane.lanes import EditError, apply_edits, parse_edits
from evolane.lanes._llm_edits import MAX_EDITS, _replace_once, check_path


def _file(path: str, content: str) -> str:
    return f"=== FILE: {path} ===\n{content}=== END FILE ===\n"


def _edit(path: str, *pairs: tuple[str, str]) -> str:
    blocks = "".join(
        f"<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n" for old, new in pairs
    )
    return f"=== EDIT: {path} ===\n{blocks}=== END EDIT ===\n"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    (root / "skill").mkdir(parents=True)
    (root / "skill" / "SKILL.md").write_text("# Skill\nbe brief\nanswer in French\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_whole_files_and_search_replace_apply_in_order(workdir: Path) -> None:
    answer = (
        "Some thinking first.\nSUMMARY: be precise, add notes\n"
        + _edit("skill/SKILL.md", ("be brief", "be precise"), ("answer in French", "answer"))
        + _file("notes/new.txt", "one\ntwo\n")
        + _edit("notes/new.txt", ("two", "three"))
        + _edit("run.sh", ("echo hi", "echo hello"))
    )
    summary, edits = parse_edits(answer)
    assert summary == "be precise, add notes"
    assert [e.index for e in edits] == [1, 2, 3, 4, 5]
    written = apply_edits(workdir, edits)
    assert written == ["skill/SKILL.md", "notes/new.txt", "run.sh"]
    assert (workdir / "skill" / "SKILL.md").read_text() == "# Skill\nbe precise\nanswer\n"
    assert (workdir / "notes" / "new.txt").read_text() == "one\nthree\n"
    assert (workdir / "run.sh").stat().st_mode & 0o777 == 0o755  # the mode is kept


def test_one_failed_edit_applies_none_and_is_named(workdir: Path) -> None:
    before = (workdir / "skill" / "SKILL.md").read_text()
    answer = _file("a.txt", "new\n") + _edit("skill/SKILL.md", ("no such line", "x"))
    _, edits = parse_edits(answer)
    with pytest.raises(EditError, match=r"edit 2 \(search/replace 'skill/SKILL.md'\).*not in"):
        apply_edits(workdir, edits)
    assert not (workdir / "a.txt").exists()
    assert (workdir / "skill" / "SKILL.md").read_text() == before


def test_an_ambiguous_or_partial_line_search_is_refused(workdir: Path) -> None:
    (workdir / "twice.txt").write_text("x = 1\ny\nx = 1\n")
    _, edits = parse_edits(_edit("twice.txt", ("x = 1", "x = 2")))
    with pytest.raises(EditError, match="found more than once"):
        apply_edits(workdir, edits)
    _, edits = parse_edits(_edit("skill/SKILL.md", ("brief", "long")))  # not a whole line
    with pytest.raises(EditError, match="not in the file"):
        apply_edits(workdir, edits)


class _CountedText(str):
    """A file's text that counts the searches made in it."""

    finds = 0

    def find(self, *args: object) -> int:  # type: ignore[override]
        _CountedText.finds += 1
        return super().find(*args)  # type: ignore[arg-type]


@given(
    lines=st.lists(st.sampled_from(["a", "a a", "b", ""]), max_size=8),
    search=st.lists(st.sampled_from(["a", "a a", "b", ""]), min_size=1, max_size=3),
)
def test_a_search_matches_whole_lines_exactly_once(lines: list[str], search: list[str]) -> None:
    text, needle = "\n".join(lines), "\n".join(search)
    lines = text.split("\n")
    starts = [i for i in range(len(lines)) if lines[i : i + len(search)] == search]
    try:
        replaced = _replace_once(text, needle, "R")
    except ValueError as error:
        assert len(starts) != 1, error
        return
    assert len(starts) == 1
    at = starts[0]
    assert replaced == "\n".join([*lines[:at], "R", *lines[at + len(search) :]])


def test_a_search_costs_a_bounded_number_of_scans() -> None:
    """A search is not tried at each place it occurs within lines (found by review:
    quadratic, about 5 minutes for a 1 MiB file, in a thread no deadline cuts)."""
    text = _CountedText("b\n" + "a" * 4000 + "\n")
    _CountedText.finds = 0
    with pytest.raises(ValueError, match="not in the file"):
        _replace_once(text, "a" * 2000, "x")
    assert _CountedText.finds <= 2


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../outside", "'..'"),
        ("skill/../../outside", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a\\..\\b", "backslash"),
        (".", "folder itself"),
    ],
)
def test_a_path_outside_the_workdir_is_refused_when_parsed(path: str, why: str) -> None:
    answer = _file("ok.txt", "fine\n") + _file(path, "evil\n")
    with pytest.raises(EditError, match=rf"edit 2 \(whole file .*refused: .*{why}"):
        parse_edits(answer)


def test_a_symlink_target_or_a_path_through_one_is_refused(workdir: Path) -> None:
    outside = workdir.parent / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("keep\n")
    (workdir / "link.txt").symlink_to(outside / "secret.txt")
    (workdir / "linked").symlink_to(outside)
    for answer, why in [
        (_file("link.txt", "evil\n"), "the target is a symlink"),
        (_edit("link.txt", ("keep", "evil")), "the target is a symlink"),
        (_file("linked/new.txt", "evil\n"), r"through a symlink \(linked\)"),
    ]:
        _, edits = parse_edits(_file("fine.txt", "ok\n") + answer)
        with pytest.raises(EditError, match=rf"edit 2 .*{why}"):
            apply_edits(workdir, edits)
    assert (outside / "secret.txt").read_text() == "keep\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (workdir / "fine.txt").exists()


@pytest.mark.parametrize(
    "data", [b"PK\x03\x04\x00\x00", b"caf\xe9 latin-1\n"], ids=["nul", "latin1"]
)
def test_a_binary_file_is_refused(workdir: Path, data: bytes) -> None:
    (workdir / "blob.bin").write_bytes(data)
    _, edits = parse_edits(_edit("blob.bin", ("x", "y")))
    with pytest.raises(EditError, match=r"edit 1 \(search/replace 'blob.bin'\).*binary"):
        apply_edits(workdir, edits)
    assert (workdir / "blob.bin").read_bytes() == data


def test_malformed_blocks_are_named() -> None:
    with pytest.raises(EditError, match=r"edit 1 .*no '=== END FILE ===' line"):
        parse_edits("=== FILE: a.txt ===\nno end\n")
    with pytest.raises(EditError, match="expected '<<<<<<< SEARCH'"):
        parse_edits("=== EDIT: a.txt ===\nold\n=== END EDIT ===\n")
    with pytest.raises(EditError, match="without '======='"):
        parse_edits("=== EDIT: a.txt ===\n<<<<<<< SEARCH\nold\n=== END EDIT ===\n")
    with pytest.raises(EditError, match="search text is empty"):
        parse_edits(_edit("a.txt", ("", "new")).replace("SEARCH\n\n", "SEARCH\n"))


def test_an_answer_holds_a_bounded_number_of_edits(workdir: Path) -> None:
    """Each edit is a write with fsyncs (or a scan of a file) in a thread no deadline cuts:
    an answer of thousands of one-line files held a 5 s optimizer call for 49 s. One edit
    past `MAX_EDITS` refuses the answer, named, before anything is written."""
    files = [_file(f"d/f{i}.txt", "x\n") for i in range(MAX_EDITS)]
    assert len(parse_edits("".join(files))[1]) == MAX_EDITS
    blocks = [("be brief", "be brief")] * 2
    answer = "".join(files[:-1]) + _edit("skill/SKILL.md", *blocks) + _file("z.txt", "z\n")
    with pytest.raises(EditError, match=rf"edit {MAX_EDITS + 1} .*at most {MAX_EDITS} edits"):
        parse_edits(answer)
    assert not (workdir / "d").exists()


def test_an_answer_without_blocks_has_no_edits() -> None:
    assert parse_edits("I would not change anything.") == ("", [])


ROOT = Path("/nonexistent-evolane-root/work")
FRAGMENTS = st.sampled_from(
    ["a", "b.txt", "..", ".", "", "/", "//", "\\", "~", " ", "...", "..a", "\x00", "é"]
)
PATHS = st.lists(FRAGMENTS, max_size=6).map("".join) | st.text(max_size=20)
LINES = st.sampled_from(
    [
        "=== END FILE ===",
        "=== END EDIT ===",
        "<<<<<<< SEARCH",
        "=======",
        ">>>>>>> REPLACE",
        "x",
        "",
        "SUMMARY: s",
    ]
)


@st.composite
def answers(draw: st.DrawFn) -> str:
    """Random marker soup, with whole well-formed blocks mixed in (so paths get through)."""
    lines = []
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["file", "edit", "header", "line"]))
        if kind == "file":
            lines += [f"=== FILE: {draw(PATHS)} ===", "x", "=== END FILE ==="]
        elif kind == "edit":
            block = ["<<<<<<< SEARCH", "x", "=======", "y", ">>>>>>> REPLACE"]
            lines += [f"=== EDIT: {draw(PATHS)} ===", *block, "=== END EDIT ==="]
        elif kind == "header":
            lines.append(f"=== {draw(st.sampled_from(['FILE', 'EDIT']))}: {draw(PATHS)} ===")
        else:
            lines.append(draw(LINES))
    return "\n".join(lines)


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(answers())
def test_no_parsed_path_resolves_outside_the_workdir(answer: str) -> None:
    try:
        _, edits = parse_edits(answer)
    except EditError:
        return
    for edit in edits:
        resolved = (ROOT / edit.path).resolve()
        assert resolved != ROOT and resolved.is_relative_to(ROOT), edit.path


@PROPERTY
@given(PATHS)
def test_a_checked_path_stays_inside(path: str) -> None:
    try:
        checked = check_path(path)
    except ValueError:
        return
    joined = os.path.normpath(os.path.join(ROOT, checked))
    assert joined.startswith(str(ROOT) + "/"), path


def _tree(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under ``root`` with its bytes (None: a folder) and mode."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mode)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(
    ("answer", "refused", "other"),
    [
        (_file("a", "x\n") + _file("a/b", "y\n"), "edit 2 (whole file 'a/b')", "edit 1"),
        (_file("a/b", "y\n") + _file("a", "x\n"), "edit 2 (whole file 'a')", "edit 1"),
        (
            _file("new/c", "c\n") + _file("skill", "s\n"),
            "edit 2 (whole file 'skill')",
            "not a regular file",
        ),
        (
            _file("ok.txt", "ok\n") + _file("d", "x\n") + _edit("d/e/f", ("a", "b")),
            "edit 3 (search/replace 'd/e/f')",
            "edit 2 (whole file 'd')",
        ),
    ],
)
def test_a_file_that_is_also_a_folder_of_another_edit_is_refused_before_writing(
    workdir: Path, answer: str, refused: str, other: str
) -> None:
    before = _tree(workdir)
    _, edits = parse_edits(answer)
    with pytest.raises(EditError) as caught:
        apply_edits(workdir, edits)
    message = str(caught.value)
    assert message.startswith(refused) and other in message
    assert _tree(workdir) == before  # nothing written, not even the first edit


def test_a_write_that_fails_undoes_the_others(workdir: Path) -> None:
    (workdir / "run.sh").chmod(0o750)
    before = _tree(workdir)
    long_name = "x" * 300  # passes the checks (its folder is new), refused by the file system
    answer = (
        _edit("skill/SKILL.md", ("be brief", "be long"))
        + _file("run.sh", "#!/bin/sh\necho bye\n")
        + _file("fresh.txt", "new\n")
        + _file(f"deep/er/{long_name}", "never\n")
    )
    _, edits = parse_edits(answer)
    with pytest.raises(EditError) as caught:
        apply_edits(workdir, edits)
    message = str(caught.value)
    assert message.startswith("edit 4 (whole file") and "nothing was applied" in message
    assert str(workdir) not in message and str(workdir.parent) not in message
    assert _tree(workdir) == before  # old bytes and modes back, new files and folders gone


def test_an_error_names_relative_paths_only(workdir: Path) -> None:
    name = "skill/" + "x" * 300  # the file system refuses the name when it is looked up
    _, edits = parse_edits(_edit(name, ("a", "b")))
    with pytest.raises(EditError) as caught:
        apply_edits(workdir, edits)
    assert str(workdir) not in str(caught.value)
    assert str(caught.value).startswith(f"edit 1 (search/replace {name!r}) cannot apply")
