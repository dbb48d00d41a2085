"""Local gates on candidate trees: order, each gate's verdicts, protected globs, the validator."""

from __future__ import annotations

import fnmatch
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from evolane.campaign._gates import (
    GateSettings,
    check_tree,
    protected_match,
    run_local_gates,
    validate_protected,
)
from evolane.inputs import CommandTemplate
from evolane.measure import CommandSettings
from evolane.messages import ArtifactRef
from evolane.messages._optimize import LocalGateResult
from evolane.sandbox import SandboxHost, lease_holders
from evolane.store import BlobStore, snapshot_tree

PARENT: dict[str, str | bytes] = {
    "main.py": "print('hello')\n",
    "prompt.txt": "be helpful\n",
    "grader/rubric.json": '{"points": 3}\n',
    "data/train.jsonl": '{"id": 1}\n',
}
ALL_PASS = ["no_op", "duplicate", "protected_paths", "size_limit", "malformed"]


class Trees:
    """Builds trees as directories under tmp_path and snapshots them."""

    def __init__(self, root: Path, store: BlobStore) -> None:
        self.root, self.store, self.count = root, store, 0

    def make(
        self,
        files: Mapping[str, str | bytes],
        links: Mapping[str, str] | None = None,
    ) -> ArtifactRef:
        self.count += 1
        folder = self.root / f"tree-{self.count}"
        for path, content in files.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)
        folder.mkdir(exist_ok=True)
        for path, link_target in (links or {}).items():
            os.symlink(link_target, folder / path)
        return snapshot_tree(self.store, folder)

    def edit(
        self, changes: Mapping[str, str | bytes | None], base: Mapping[str, str | bytes] = PARENT
    ) -> ArtifactRef:
        """The base tree with files replaced, added, or (None) removed."""
        files = {**base, **{k: v for k, v in changes.items() if v is not None}}
        for path, content in changes.items():
            if content is None:
                del files[path]
        return self.make(files)


@pytest.fixture
def trees(tmp_path: Path, store: BlobStore) -> Trees:
    return Trees(tmp_path / "trees", store)


@pytest.fixture
def parent(trees: Trees) -> ArtifactRef:
    return trees.make(PARENT)


def gates(results: list[LocalGateResult]) -> list[str]:
    return [result.gate for result in results]


def outcomes(results: list[LocalGateResult]) -> list[str]:
    return [result.outcome for result in results]


# -- order, no_op, duplicate ------------------------------------------------------------


def test_a_good_candidate_passes_every_gate_in_order(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    candidate = trees.edit({"prompt.txt": "be more helpful\n"})
    settings = GateSettings(protected=("grader",), required_files=("main.py",))
    results = check_tree(store, settings, parent, candidate, seen={"sha256:" + "0" * 64})
    assert gates(results) == ALL_PASS
    assert all(result.passed for result in results)


def test_the_parent_tree_itself_is_a_no_op(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    same_content = trees.make(PARENT)  # a fresh snapshot of identical files: same digest
    results = check_tree(store, GateSettings(), parent, same_content, seen=())
    assert [(r.gate, r.outcome, r.reason) for r in results] == [
        ("no_op", "reject", "same tree as the parent")
    ]


def test_an_earlier_candidate_is_a_duplicate(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    first = trees.edit({"prompt.txt": "v1\n"})
    assert outcomes(check_tree(store, GateSettings(), parent, first, seen=set())) == ["pass"] * 5
    again = trees.edit({"prompt.txt": "v1\n"})
    results = check_tree(store, GateSettings(), parent, again, seen={first.digest})
    assert gates(results) == ["no_op", "duplicate"]
    assert outcomes(results) == ["pass", "reject"]


def test_the_first_failing_gate_stops_the_rest(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    # Tampers with the grader, is far too big and lacks a required file: only tampering shows.
    candidate = trees.edit({"grader/rubric.json": "{}", "big.bin": b"x" * 5000, "main.py": None})
    settings = GateSettings(protected=("grader",), max_file_bytes=100, required_files=("main.py",))
    results = check_tree(store, settings, parent, candidate, seen=())
    assert gates(results) == ["no_op", "duplicate", "protected_paths"]
    assert outcomes(results) == ["pass", "pass", "indecisive"]
    # Without the protection, the size gate is next and the required file is never checked.
    results = check_tree(
        store, GateSettings(max_file_bytes=100, required_files=("main.py",)), parent, candidate, ()
    )
    assert gates(results) == ["no_op", "duplicate", "protected_paths", "size_limit"]
    assert results[-1].outcome == "reject"


# -- protected_paths --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "offenders"),
    [
        ({"grader/rubric.json": '{"points": 99}\n'}, ["grader/rubric.json"]),  # changed
        ({"grader/rubric.json": None}, ["grader/rubric.json"]),  # removed
        ({"grader/extra.py": "x = 1\n"}, ["grader/extra.py"]),  # added under the directory
        (
            {"data/train.jsonl": "{}\n", "data/new.jsonl": "{}\n"},
            ["data/new.jsonl", "data/train.jsonl"],
        ),
        ({"README.md": "# hi\n"}, ["README.md"]),
    ],
)
def test_touching_a_protected_path_is_indecisive(
    store: BlobStore,
    trees: Trees,
    parent: ArtifactRef,
    changes: dict[str, str | None],
    offenders: list[str],
) -> None:
    settings = GateSettings(protected=("grader", "data/*.jsonl", "README.md"))
    results = check_tree(store, settings, parent, trees.edit(changes), seen=())
    verdict = results[-1]
    assert (verdict.gate, verdict.outcome) == ("protected_paths", "indecisive")
    assert list(verdict.paths) == offenders
    assert all(path in verdict.reason for path in offenders)


def test_edits_beside_protected_paths_pass(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    settings = GateSettings(protected=("grader/**", "data/*.jsonl", "README.md"))
    candidate = trees.edit(
        {
            "graders.txt": "x",
            "data/notes.txt": "n",
            "data/sub/deep.jsonl": "{}",
            "docs/README.md": "d",
        }
    )
    results = check_tree(store, settings, parent, candidate, seen=())
    assert outcomes(results) == ["pass"] * 5


def test_protected_offenders_are_capped_at_four_and_counted(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    candidate = trees.edit({f"grader/new{i}.txt": str(i) for i in range(7)})
    results = check_tree(store, GateSettings(protected=("grader",)), parent, candidate, seen=())
    verdict = results[-1]
    assert verdict.paths == tuple(f"grader/new{i}.txt" for i in range(4))
    assert "+3 more" in verdict.reason


def test_a_protected_path_too_long_for_a_message_is_shortened(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    long_path = "grader/" + "/".join(["d" * 100] * 3) + "/f.txt"
    results = check_tree(
        store, GateSettings(protected=("grader",)), parent, trees.edit({long_path: "x"}), seen=()
    )
    verdict = results[-1]
    assert verdict.outcome == "indecisive"
    assert len(verdict.paths[0]) <= 256 and verdict.paths[0].startswith("grader/ddd")
    assert len(verdict.reason) <= 256


# -- size_limit -------------------------------------------------------------------------


def size_verdict(
    store: BlobStore, parent: ArtifactRef, candidate: ArtifactRef, **limits: int
) -> LocalGateResult:
    results = check_tree(store, GateSettings(**limits), parent, candidate, seen=())  # type: ignore[arg-type]
    assert gates(results)[:4] == ALL_PASS[:4]
    return results[3]


def test_size_limits_reject_with_the_numbers(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    parent_bytes = sum(len(str(v)) for v in PARENT.values())
    grown = trees.edit({"a.txt": "a" * 100, "b.txt": "b" * 300})  # 6 files, +400 bytes

    verdict = size_verdict(store, parent, grown, max_files=5)
    assert verdict.outcome == "reject" and "6 files" in verdict.reason and "5" in verdict.reason
    assert size_verdict(store, parent, grown, max_files=6).passed

    total = parent_bytes + 400
    verdict = size_verdict(store, parent, grown, max_tree_bytes=total - 1)
    assert verdict.outcome == "reject" and f"{total} bytes" in verdict.reason
    assert size_verdict(store, parent, grown, max_tree_bytes=total).passed

    verdict = size_verdict(store, parent, grown, max_file_bytes=99)
    assert verdict.outcome == "reject" and verdict.paths == ("b.txt", "a.txt")  # largest first
    assert "'b.txt': 300 bytes" in verdict.reason and "99" in verdict.reason
    assert size_verdict(store, parent, grown, max_file_bytes=300).passed

    verdict = size_verdict(store, parent, grown, max_growth_bytes=399)
    assert verdict.outcome == "reject" and "grows by 400 bytes" in verdict.reason
    assert size_verdict(store, parent, grown, max_growth_bytes=400).passed


def test_the_file_limit_counts_only_added_or_changed_files(store: BlobStore, trees: Trees) -> None:
    base: dict[str, str | bytes] = {"big.bin": b"z" * 1000, "small.txt": "s"}
    parent = trees.make(base)
    untouched = trees.edit({"small.txt": "t"}, base=base)
    assert size_verdict(store, parent, untouched, max_file_bytes=10).passed
    changed = trees.edit({"big.bin": b"y" * 1000}, base=base)
    verdict = size_verdict(store, parent, changed, max_file_bytes=10)
    assert verdict.outcome == "reject" and verdict.paths == ("big.bin",)


def test_a_shrinking_candidate_has_no_growth(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    smaller = trees.edit({"prompt.txt": None, "extra.txt": "e"})
    assert size_verdict(store, parent, smaller, max_growth_bytes=0).passed


# -- malformed: required files ----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"main.py": None}, "'main.py' is missing"),
        ({"main.py": ""}, "'main.py' is empty"),
    ],
)
def test_required_files_must_exist_and_be_non_empty(
    store: BlobStore,
    trees: Trees,
    parent: ArtifactRef,
    changes: dict[str, str | None],
    problem: str,
) -> None:
    settings = GateSettings(required_files=("main.py", "prompt.txt"))
    results = check_tree(store, settings, parent, trees.edit(changes), seen=())
    assert gates(results) == ALL_PASS
    verdict = results[-1]
    assert verdict.outcome == "reject" and problem in verdict.reason
    assert verdict.paths == ("main.py",)


def test_a_symlink_is_not_a_required_file(
    store: BlobStore, trees: Trees, parent: ArtifactRef
) -> None:
    files = {k: v for k, v in PARENT.items() if k != "main.py"} | {"real.py": "x = 1\n"}
    candidate = trees.make(files, links={"main.py": "real.py"})
    results = check_tree(store, GateSettings(required_files=("main.py",)), parent, candidate, ())
    assert results[-1].outcome == "reject" and "not a regular file" in results[-1].reason


# -- settings and glob semantics --------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("grader", "grader", True),
        ("grader", "grader/rubric.json", True),  # everything under a matching directory
        ("grader", "grader/a/b/c.txt", True),
        ("grader", "graders/x", False),
        ("grader", "sub/grader/x", False),  # anchored at the root
        ("grader/", "grader/x", True),
        ("./grader", "grader/x", True),
        ("grader/**", "grader", True),
        ("grader/**", "grader/a/b", True),
        ("grader/**", "graderx", False),
        ("**", "anything/at/all", True),
        ("**/secret.txt", "secret.txt", True),  # ** matches zero segments
        ("**/secret.txt", "a/b/secret.txt", True),
        ("**/secret.txt", "a/not-secret.txt", False),
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("a/**/b", "a/xb", False),
        ("a/**/b", "ab", False),
        ("a/**/**/b", "a/b", True),
        ("data/*.jsonl", "data/train.jsonl", True),
        ("data/*.jsonl", "data/.jsonl", True),
        ("data/*.jsonl", "data/sub/x.jsonl", False),  # * stays within one segment
        ("data/*.jsonl", "data/train.jsonl.bak", False),
        ("*", "top.txt", True),
        ("*", "any/path", True),  # every top-level entry, and all under it
        ("*.md", "README.md", True),
        ("*.md", "docs/README.md", False),
        ("*/*.md", "docs/README.md", True),
        ("f?o", "foo", True),
        ("f?o", "fooo", False),
        ("a?b", "a/b", False),  # ? never matches a separator
        ("[abc].txt", "b.txt", True),
        ("[abc].txt", "d.txt", False),
        ("[a-c].txt", "c.txt", True),
        ("[!a].txt", "b.txt", True),
        ("[!a].txt", "a.txt", False),
        ("[]]x", "]x", True),
        ("file[", "file[", True),  # an unclosed bracket is literal
        ("a.b", "axb", False),  # regex metacharacters are literal
        ("(x)+", "(x)+", True),
        ("README.md", "readme.md", False),  # case-sensitive
    ],
)
def test_protected_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert protected_match(pattern, path) is expected


@pytest.mark.parametrize("pattern", ["", "/grader", "../x", "a/../b", "..", ".", "/", "[z-a]"])
def test_invalid_protected_patterns_raise_naming_the_pattern(pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid protected pattern") as caught:
        validate_protected(["ok/**", pattern])
    assert repr(pattern) in str(caught.value)
    with pytest.raises(ValueError):
        protected_match(pattern, "x")
    with pytest.raises(ValueError):
        GateSettings(protected=(pattern,))


def test_settings_refuse_bad_required_files_and_validator_placeholders() -> None:
    validate_protected(["grader/**", "data/*.jsonl", "README.md"])
    for path in ("../x", "/abs", "", "a//b", "./a"):
        with pytest.raises(ValueError, match="required file"):
            GateSettings(required_files=(path,))
    with pytest.raises(ValueError, match="max_files"):
        GateSettings(max_files=-1)
    with pytest.raises(ValueError, match="validator_timeout"):
        GateSettings(validator_timeout=0)
    seeded = CommandTemplate.parse("check {seed}", role="validator", allowed={"seed"})
    with pytest.raises(ValueError, match=r"\{seed\}"):
        GateSettings(validator=seeded)


_SEGMENT = st.text(alphabet="abc.-_", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
_PATH = st.lists(_SEGMENT, min_size=1, max_size=5).map("/".join)


@given(path=_PATH, below=st.lists(_SEGMENT, max_size=3))
def test_a_literal_pattern_protects_itself_and_everything_below(
    path: str, below: list[str]
) -> None:
    assert protected_match(path, "/".join([path, *below]))
    assert protected_match("**/" + path.rsplit("/", 1)[-1], "/".join(["x", path]))
    assert not protected_match(path, path + "x")


_GLOB_SEGMENT = st.text(alphabet="ab*?.", min_size=1, max_size=5).filter(
    lambda s: s not in (".", "..") and "**" not in s
)


@given(segments=st.lists(st.tuples(_GLOB_SEGMENT, _SEGMENT), min_size=1, max_size=4))
def test_single_segment_wildcards_agree_with_fnmatch(segments: list[tuple[str, str]]) -> None:
    pattern = "/".join(glob for glob, _ in segments)
    path = "/".join(name for _, name in segments)
    expected = all(fnmatch.fnmatchcase(name, glob) for glob, name in segments)
    assert protected_match(pattern, path) is expected


# -- the validator ----------------------------------------------------------------------


def validator(text: str) -> CommandTemplate:
    return CommandTemplate.parse(text, role="validator", allowed={"candidate", "workspace"})


def gate_dirs(host: SandboxHost) -> list[Path]:
    gates_root = host.lease_dir / "gates"
    return list(gates_root.iterdir()) if gates_root.exists() else []


async def test_a_failing_validator_rejects_with_its_first_stderr_line(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef
) -> None:
    settings = GateSettings(
        validator=validator(
            "sh -c 'echo out; echo; echo \"syntax error in main.py\" >&2; echo second >&2; exit 3'"
        )
    )
    with trio.fail_after(20):
        results = await run_local_gates(store, host, settings, parent, trees.edit({"x": "1"}), ())
    assert gates(results) == ALL_PASS
    verdict = results[-1]
    assert verdict.outcome == "reject"
    assert verdict.reason == "the validator failed (exit 3): syntax error in main.py"
    assert gate_dirs(host) == []


async def test_a_silent_failure_names_the_exit_code_and_long_lines_are_cut(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef
) -> None:
    candidate = trees.edit({"x": "1"})
    with trio.fail_after(20):
        quiet = await run_local_gates(
            store, host, GateSettings(validator=validator("sh -c 'exit 3'")), parent, candidate, ()
        )
        loud = await run_local_gates(
            store,
            host,
            GateSettings(validator=validator("sh -c 'printf \"%0600d\" 7; exit 1'")),
            parent,
            candidate,
            (),
        )
    assert (quiet[-1].outcome, quiet[-1].reason) == ("reject", "the validator failed (exit 3)")
    assert loud[-1].outcome == "reject" and len(loud[-1].reason) == 256
    assert loud[-1].reason.startswith("the validator failed (exit 1): 0000")


async def test_the_validator_sees_the_candidate_and_a_writable_workspace(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef
) -> None:
    script = (
        "import os, pathlib, sys; "
        "c = pathlib.Path(sys.argv[1]); w = pathlib.Path(sys.argv[2]); "
        "assert pathlib.Path.cwd() == w, 'cwd is not the workspace'; "
        "(w / 'scratch.txt').write_text('ok'); "
        "sys.exit(0 if 'def main' in (c / 'main.py').read_text() else 'main.py has no main()')"
    )
    command = f"{sys.executable} -c {shlex.quote(script)} {{candidate}} {{workspace}}"
    settings = GateSettings(validator=validator(command), required_files=("main.py",))
    good = trees.edit({"main.py": "def main():\n    pass\n"})
    bad = trees.edit({"main.py": "print('no main')\n"})
    with trio.fail_after(30):
        passed = await run_local_gates(store, host, settings, parent, good, ())
        failed = await run_local_gates(store, host, settings, parent, bad, ())
    assert gates(passed) == ALL_PASS and all(result.passed for result in passed)
    assert failed[-1].outcome == "reject" and failed[-1].reason.endswith("main.py has no main()")
    assert gate_dirs(host) == []


async def test_a_validator_that_times_out_is_indecisive_and_leaves_nothing(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef
) -> None:
    settings = GateSettings(
        validator=validator("sleep 30"),
        validator_timeout=0.5,
        commands=CommandSettings(kill_grace=0.5),
    )
    with trio.fail_after(10):
        results = await run_local_gates(store, host, settings, parent, trees.edit({"x": "1"}), ())
    verdict = results[-1]
    assert (verdict.gate, verdict.outcome) == ("malformed", "indecisive")
    assert "timed out after 0.5s" in verdict.reason
    assert gate_dirs(host) == [] and not lease_holders(host.lease)


async def test_a_validator_that_cannot_start_or_is_stopped_is_indecisive(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef
) -> None:
    candidate = trees.edit({"x": "1"})
    missing = GateSettings(validator=validator("no-such-validator-program {candidate}"))
    slow = GateSettings(validator=validator("sleep 30"))
    stop = trio.Event()
    with trio.fail_after(15):
        spawn = await run_local_gates(store, host, missing, parent, candidate, ())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_set_later, stop, 0.3)
            stopped = await run_local_gates(store, host, slow, parent, candidate, (), stop=stop)
    assert spawn[-1].outcome == "indecisive" and "did not start" in spawn[-1].reason
    assert stopped[-1].outcome == "indecisive" and "stopped" in stopped[-1].reason
    assert gate_dirs(host) == []


async def _set_later(event: trio.Event, seconds: float) -> None:
    await trio.sleep(seconds)
    event.set()


async def test_a_cancelled_validator_leaves_no_process_and_no_scratch(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef, tmp_path: Path
) -> None:
    marker = tmp_path / "validator-started"  # a confined validator may write only there
    settings = GateSettings(
        validator=validator(f"sh -c 'touch {marker}; trap \"\" TERM; sleep 30'"),
        commands=CommandSettings(kill_grace=0.3, expose_rw=(str(tmp_path),)),
    )
    with trio.fail_after(15):
        with trio.move_on_after(60) as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_started() -> None:
                    while not marker.exists():
                        await trio.sleep(0.02)
                    assert gate_dirs(host) != []  # the candidate is laid out while it runs
                    scope.cancel()

                nursery.start_soon(cancel_once_started)
                await run_local_gates(store, host, settings, parent, trees.edit({"x": "1"}), ())
                pytest.fail("the validator returned although it was cancelled")
    assert scope.cancelled_caught
    assert gate_dirs(host) == [] and not lease_holders(host.lease)


async def test_the_validator_runs_only_after_every_other_gate_passes(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef, tmp_path: Path
) -> None:
    marker = tmp_path / "validator-ran"  # a confined validator may write only there
    settings = GateSettings(
        protected=("grader",),
        required_files=("main.py",),
        validator=validator(f"touch {marker}"),
        commands=CommandSettings(expose_rw=(str(tmp_path),)),
    )
    tampering = trees.edit({"grader/rubric.json": "{}"})
    missing_main = trees.edit({"main.py": None})
    with trio.fail_after(20):
        first = await run_local_gates(store, host, settings, parent, tampering, ())
        second = await run_local_gates(store, host, settings, parent, missing_main, ())
        assert not marker.exists()
        third = await run_local_gates(store, host, settings, parent, trees.edit({"y": "1"}), ())
    assert first[-1].gate == "protected_paths" and second[-1].outcome == "reject"
    assert marker.exists() and outcomes(third) == ["pass"] * 5
    # check_tree alone never runs the command.
    marker.unlink()
    assert outcomes(check_tree(store, settings, parent, trees.edit({"z": "1"}), ())) == ["pass"] * 5
    assert not marker.exists()


async def test_an_escaping_symlink_is_malformed_for_the_validator(
    store: BlobStore, host: SandboxHost, trees: Trees, parent: ArtifactRef
) -> None:
    candidate = trees.make(PARENT, links={"escape": "../../etc/passwd"})
    settings = GateSettings(validator=validator("true"))
    with trio.fail_after(20):
        results = await run_local_gates(store, host, settings, parent, candidate, ())
    assert results[-1].outcome == "reject" and "escape" in results[-1].reason
    assert gate_dirs(host) == []
