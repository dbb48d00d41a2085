"""What a person reads after a run, through the real CLI: report.md's per-case table, its
decisions (rule, delta, the optimizer's summary) and no phantom rows; `evolane diff` and
`evolane compare`; and advice that names a command that works (a failed run, a live run)."""

from __future__ import annotations

import html
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from evolane.campaign import StoreLayout, unified_tree_diff
from evolane.campaign._markdown import CHOSEN_ON_VAL, GATE_CI_NOTE
from evolane.store import BlobStore
from tests.campaign_helpers import toy_flags, with_flag, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
PLAN = {"0.0": "fix:2", "0.1": "symlink", "1.0": "fix:1", "1.1": "harm:1"}
GATED_REPLAY = (
    "sh -c 'while [ ! -e {gate}/open ]; do sleep 0.05; done; "
    'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' replay {{candidate}} {{output_dir}}'
)
"""A replay that waits until the test creates ``open`` in the gate folder (as in
tests/test_cli_watch.py): the run stays live for as long as the test needs."""


def _evolane(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@dataclass(frozen=True)
class Runs:
    """Two finished toy runs in one store (two iterations; then one), and their reports."""

    store: Path
    first: str
    second: str

    def report(self, run_id: str) -> dict:
        return json.loads((self.store / "runs" / run_id / "report.json").read_text())

    def md(self, run_id: str) -> str:
        return (self.store / "runs" / run_id / "report.md").read_text()

    def blobs(self) -> BlobStore:
        return StoreLayout(self.store).blobs()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("words")
    paths = write_toy(root / "toy", PLAN)
    flags = with_flag(toy_flags(paths, root / "store"), "--iterations", "2")
    ids = []
    for iterations in ("2", "1"):
        done = _evolane("optimize", *with_flag(flags, "--iterations", iterations), cwd=root)
        assert done.returncode == 0, done.stderr
        known = {p.name for p in (root / "store" / "runs").iterdir()}
        (new,) = known - set(ids)
        ids.append(new)
    return Runs(root / "store", ids[0], ids[1])


def _units(runs: Runs, report: dict, purpose: str) -> list[dict]:
    (m,) = [m for m in report["measurements"] if m["purpose"] == purpose]
    return orjson.loads(runs.blobs().read_bytes(m["units_ref"]["digest"]))


def _changes(units: list[dict]) -> dict[str, str]:
    """fixed / broken / same of each case, from the unit records (pass: every run >= 1)."""
    passes: dict[str, dict[str, bool]] = {}
    for unit in units:
        if unit.get("score") is not None:
            arm = passes.setdefault(unit["case"], {})
            arm[unit["arm"]] = arm.get(unit["arm"], True) and unit["score"] >= 1.0
    return {
        case: "fixed"
        if arms["candidate"] and not arms["baseline"]
        else "broken"
        if arms["baseline"] and not arms["candidate"]
        else "same"
        for case, arms in passes.items()
    }


def _table_rows(md: str, split: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0] == split:
            rows[cells[1]] = cells
    return rows


def test_report_md_holds_the_per_case_table_of_the_best_against_the_seed(runs: Runs) -> None:
    report, md = runs.report(runs.first), runs.md(runs.first)
    assert "## Cases: the best against the seed" in md
    for split, purpose in (("val", "final_val"), ("test", "final_test")):
        changes = _changes(_units(runs, report, purpose))
        rows = _table_rows(md, split)
        assert set(rows) == set(changes)  # every case of the split, once
        for case, change in changes.items():
            assert rows[case][4].split()[0] == change, (case, rows[case])
        fixed = sum(c == "fixed" for c in changes.values())
        broken = sum(c == "broken" for c in changes.values())
        assert f"- {split}: {fixed} fixed, {broken} broken, " in md
    assert sum(c == "fixed" for c in _changes(_units(runs, report, "final_val")).values()) == 3
    still = [r for r in _table_rows(md, "val").values() if r[4] == "same (fail)"]
    assert still and all(r[5] for r in still)  # a still-failing case says why


def test_every_decision_shows_its_rule_delta_and_the_optimizers_summary(runs: Runs) -> None:
    report, md = runs.report(runs.first), runs.md(runs.first)
    deciding = {m["measurement_id"]: m for m in report["measurements"]}
    lines = [line for line in md.splitlines() if line.startswith("| 0 | ")]
    assert len(lines) == len(report["decisions"]) == 4
    for line, decision in zip(lines, report["decisions"], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        slot = f"c0.i{decision['iteration']}.s{decision['slot']}"
        where = (decision["iteration"], decision["slot"])
        assert cells[4] == PLAN[f"{decision['iteration']}.{decision['slot']}"]  # its summary
        assert cells[7] == decision["reason"] and cells[6] == decision["decision"]
        assert cells[3], "an empty candidate cell"
        if slot in deciding:
            m = deciding[slot]
            delta = f"{m['mean_delta']:+.3f} ({m['se']:.4f})"
            selected = any(
                f["terminal"] == "selected" and (f["iteration"], f["slot"]) == where
                for f in report["funnel"]
            )
            assert cells[5] == delta + (f" ({CHOSEN_ON_VAL})" if selected else "")
            assert "accepted" in cells[7] or "rejected" in cells[7]  # the rule's verdict
    symlink = lines[1]
    assert "rejected by local gate disallowed_entries (link)" in symlink


def test_the_selected_candidates_val_delta_is_marked_optimistic(runs: Runs) -> None:
    # Winner's curse (review): the chosen candidate's val delta and CI lean high (+0.12 to
    # +0.18 with no true effect); report.md said so only on its head "val:" line.
    report, md = runs.report(runs.first), runs.md(runs.first)
    funnel = report["funnel"]
    chosen = {f"c0.i{f['iteration']}.s{f['slot']}" for f in funnel if f["terminal"] == "selected"}
    assert chosen
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| c")}
    for slot in chosen:
        assert CHOSEN_ON_VAL in rows[slot], rows[slot]  # its funnel row and measurement row
    others = [line for key, line in rows.items() if key.startswith("c0.") and key not in chosen]
    assert others and not any(CHOSEN_ON_VAL in line for line in others)
    assert GATE_CI_NOTE in md and "| CI (gate's bootstrap) |" in md


def test_no_baseline_row_for_an_iteration_that_did_not_run(runs: Runs) -> None:
    report = runs.report(runs.first)
    ran = {i["iteration"] for i in report["iterations"]}
    assert ran == {0, 1}
    bases = [m for m in report["measurements"] if m["purpose"] == "baseline"]
    assert {m["iteration"] for m in bases} <= ran and bases
    assert "c0.i2.base" not in runs.md(runs.first)
    final = [m for m in report["measurements"] if m["purpose"] == "final_val"]
    assert final[0]["n"] == final[0]["n_planned"] == 12  # the final val still ran whole


def test_report_md_names_the_isolation_in_words_and_json_keeps_the_names(runs: Runs) -> None:
    report, md = runs.report(runs.first), runs.md(runs.first)
    assert "lease_sweep" in report["isolation"]  # report.json is data: mechanism names
    (line,) = [row for row in md.splitlines() if "isolation:" in row]
    assert "processes reaped on exit" in line
    for jargon in ("lease_sweep", "subreaper", "lifeline"):
        assert jargon not in line
    shown = _evolane("report", runs.first, "--store", str(runs.store))
    assert shown.returncode == 0, shown.stderr
    assert "processes reaped on exit" in shown.stdout and "lease_sweep" not in shown.stdout


def test_diff_prints_the_best_or_a_candidate_against_the_seed(runs: Runs) -> None:
    report, store = runs.report(runs.first), str(runs.store)
    best = subprocess.run(
        [*EVOLANE, "diff", runs.first, "--store", store], capture_output=True, timeout=120
    )
    assert best.returncode == 0, best.stderr
    stored = runs.blobs().read_bytes(report["artifacts"]["best_diff"]["digest"])
    assert best.stdout == stored and b"+++ b/val04" in stored
    (harm,) = [
        d["digest"] for d in report["decisions"] if d["decision"] == "reject" and d["digest"]
    ]
    one = subprocess.run(
        [*EVOLANE, "diff", runs.first, "--candidate", harm[7:17], "--store", store],
        capture_output=True,
        timeout=120,
    )
    assert one.returncode == 0, one.stderr
    expected = unified_tree_diff(runs.blobs(), report["seed"]["digest"], harm)
    assert one.stdout == expected and one.stdout != best.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--candidate", "0000ffff"], "no candidate of run"),
        (["--best", "--candidate", "ab"], "exclusive"),
    ],
)
def test_diff_of_an_unknown_digest_or_bad_flags_is_one_line_exit_2(
    runs: Runs, args: list[str], words: str
) -> None:
    bad = _evolane("diff", runs.first, *args, "--store", str(runs.store))
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and words in bad.stderr
    unknown = _evolane("diff", "r-nope", "--store", str(runs.store))
    assert unknown.returncode == 2 and "unknown run 'r-nope'" in unknown.stderr


def test_compare_puts_two_runs_side_by_side(runs: Runs) -> None:
    a, b = runs.report(runs.first), runs.report(runs.second)
    shown = _evolane("compare", runs.first, runs.second, "--store", str(runs.store))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert runs.first in text and runs.second in text
    (line,) = [ln for ln in text.splitlines() if ln.split()[:1] == ["iterations"]]
    assert line.split() == ["iterations", "2", "1"]
    for report in (a, b):
        val = report["scores"]["best_val"]
        assert f"{val['mean']:.3f} [{val['ci_low']:.3f}, {val['ci_high']:.3f}]" in text
    assert "command time" in text and "c0.i1.s1" in text  # spend, and a decision of A only
    as_json = _evolane("compare", runs.first, runs.second, "--store", str(runs.store), "--json")
    found = json.loads(as_json.stdout)
    assert found["runs"] == [runs.first, runs.second]
    assert found["settings"]["iterations"] == {"a": "2", "b": "1"}
    assert "target" in found["settings"]  # a main setting, equal in both
    assert found["decisions"]["c0.i1.s1"]["b"] == "-"


def test_a_failed_run_with_a_relative_script_advises_a_command_that_works(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path / "toy", PLAN)
    (tmp_path / "replay.sh").write_text('cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n')
    flags = with_flag(toy_flags(paths, tmp_path / "store"), "--iterations", "1")
    relative = with_flag(flags, "--replay", "sh replay.sh {candidate} {output_dir}")
    failed = _evolane("optimize", *relative, cwd=tmp_path)
    assert failed.returncode != 0 and failed.stdout.startswith("failed")
    assert (
        "hint: the replay command names replay.sh by a relative path, but commands run in a "
        f"folder of their own: give its absolute path ({tmp_path / 'replay.sh'})"
    ) in failed.stdout
    assert "a new campaign" in failed.stdout and "continue:" not in failed.stdout
    campaign = failed.stdout.split()[2].rstrip(":")
    replay = f"sh {tmp_path / 'replay.sh'} {{candidate}} {{output_dir}}"
    fixed = with_flag(flags, "--replay", replay)
    refused = _evolane("optimize", *fixed, "--resume-campaign", campaign, cwd=tmp_path)
    assert refused.returncode == 2
    assert "the replay changed" in refused.stderr
    assert "start a new campaign with the same flags instead" in refused.stderr
    advised = _evolane("optimize", *fixed, cwd=tmp_path)  # what both pieces of advice say
    assert advised.returncode == 0 and advised.stdout.startswith("finished"), advised.stderr


def _gated_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A one-iteration toy run whose replays wait for ``tmp_path/gate``, and its store."""
    gate = tmp_path / "gate"
    gate.mkdir()
    paths = write_toy(tmp_path / "toy", PLAN)
    flags = with_flag(toy_flags(paths, tmp_path / "store"), "--iterations", "1")
    flags = [*with_flag(flags, "--replay", GATED_REPLAY.format(gate=gate)), "--expose", str(gate)]
    run = subprocess.Popen([*EVOLANE, "optimize", *flags], stdout=subprocess.DEVNULL, cwd=tmp_path)
    return run, tmp_path / "store"


def test_report_on_a_live_run_says_it_is_running_and_suggests_watch(tmp_path: Path) -> None:
    run, store = _gated_run(tmp_path)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing figure
        while True:
            assert run.poll() is None and time.monotonic() < deadline
            found = list(store.glob("runs/*/events.jsonl"))
            if found:
                run_id = found[0].parent.name
                shown = _evolane("report", run_id, "--store", str(store))
                if f"pid {run.pid}" in shown.stdout:
                    break
            time.sleep(0.1)
        assert shown.returncode == 0, shown.stderr
        assert f"evolane watch {run_id} --store {store}" in shown.stdout
        assert "--resume" not in shown.stdout
        resumed = _evolane("optimize", "--resume", run_id, "--store", str(store))
        assert resumed.returncode == 2
        assert f"(pid {run.pid})" in resumed.stderr
        assert f"follow it with `evolane watch {run_id}`" in resumed.stderr
        (tmp_path / "gate" / "open").touch()
        assert run.wait(timeout=120) == 0
    finally:
        (tmp_path / "gate" / "open").touch()
        if run.poll() is None:
            run.kill()
            run.wait()


def test_a_campaign_cannot_change_its_error_control_between_cycles(tmp_path: Path) -> None:
    # Found by review: a cycle run with --error-control none chose a useless best that the
    # next cycle, online by default, published under a guarantee that never covered it.
    paths = write_toy(tmp_path / "toy", PLAN)
    flags = with_flag(toy_flags(paths, tmp_path / "store"), "--iterations", "1")
    flags += ["--max-improvement-cycles", "3"]
    first = _evolane("optimize", *flags, "--error-control", "none", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    campaign = first.stdout.split()[2].rstrip(":")
    for changed in (
        ["--error-control", "online"],
        ["--error-control", "none", "--confidence", "0.9"],
    ):
        refused = _evolane(
            "optimize", *flags, *changed, "--resume-campaign", campaign, cwd=tmp_path
        )
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        key = "error_control" if "online" in changed else "confidence"
        assert f"the {key} changed" in refused.stderr, refused.stderr
    same = _evolane(
        "optimize", *flags, "--error-control", "none", "--resume-campaign", campaign, cwd=tmp_path
    )
    assert same.returncode == 0, same.stderr


def test_compare_warns_when_the_runs_read_different_datasets(runs: Runs, tmp_path: Path) -> None:
    """Found by review: two runs of the same dataset path, its cases edited in between, were
    put side by side with no word: their scores read as comparable when they were not."""
    same = _evolane("compare", runs.first, runs.second, "--store", str(runs.store), "--json")
    assert json.loads(same.stdout)["warnings"] == []
    paths = write_toy(tmp_path / "toy", PLAN)
    flags = with_flag(toy_flags(paths, tmp_path / "store"), "--iterations", "1")
    ids: list[str] = []
    for _ in range(2):
        done = _evolane("optimize", *flags, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (new,) = {p.name for p in (tmp_path / "store" / "runs").iterdir()} - set(ids)
        ids.append(new)
        rows = paths["dataset"].read_text().splitlines()
        paths["dataset"].write_text("\n".join(rows[:-1]) + "\n")  # one test case fewer
    store = str(tmp_path / "store")
    shown = _evolane("compare", *ids, "--store", store)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("warning: the runs read different datasets"), shown.stdout
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.split()[:2] == ["dataset", "content"]]
    assert len(set(line.split()[2:])) == 2  # two digests
    found = json.loads(_evolane("compare", *ids, "--store", store, "--json").stdout)
    assert found["warnings"] and "different datasets" in found["warnings"][0]


def test_report_text_marks_the_val_scores_optimistic_as_the_summary_and_md_do(runs: Runs) -> None:
    # Found by review: the summary's "val:" line and report.md said the best's val scores
    # were optimistic (val fed the optimizer; the best was chosen on them), `evolane report`
    # printed the same figures with no caveat.
    assert runs.report(runs.first)["selected"] is not None
    shown = _evolane("report", runs.first, "--store", str(runs.store))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("│ val "))
    end = next(i for i, line in enumerate(lines) if line.startswith("│ test (sealed)"))
    row = " ".join(line.split("│")[2].strip() for line in lines[start:end])
    assert "(optimistic: val fed the optimizer)" in row, shown.stdout


def test_a_resumed_runs_wall_counts_every_session(tmp_path: Path) -> None:
    # Found by review: a run cut by Ctrl-C and resumed said "wall 2.3 s" (its last session
    # alone) in the summary, report.md, `evolane report`, `runs` and report.html, beside the
    # command time of both sessions (18.1 s) and a page whose run clock went on to ~10 s.
    run, store = _gated_run(tmp_path)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing figure
        while not list(store.glob("runs/*/events.jsonl")):
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=120) == 130
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    (run_id,) = [p.name for p in (store / "runs").iterdir()]
    first = runs_report(store, run_id)["wall_seconds"]
    (tmp_path / "gate" / "open").touch()
    done = _evolane("optimize", "--resume", run_id, "--store", str(store), "--progress", "none")
    assert done.returncode == 0, done.stderr
    report = runs_report(store, run_id)
    total = report["run_wall_seconds"]
    assert report["resumed"] == 1 and total == pytest.approx(first + report["wall_seconds"])
    said = f"{total:.1f} s over 2 sessions ({report['wall_seconds']:.1f} s this one)"
    assert said in done.stdout.splitlines()[0], done.stdout
    assert f"- wall: {said}" in (store / "runs" / run_id / "report.md").read_text()
    assert said in (store / "runs" / run_id / "report.html").read_text()
    listed = json.loads(_evolane("runs", "--store", str(store), "--json").stdout)
    assert [r["wall_seconds"] for r in listed["runs"]] == [pytest.approx(total)]
    checked = _evolane("fsck", "--store", str(store))  # found by review: it called the
    assert checked.returncode == 0, checked.stdout  # summary of the run's wall wrong


def runs_report(store: Path, run_id: str) -> dict:
    """``report.json`` of ``run_id`` in ``store``."""
    return json.loads((store / "runs" / run_id / "report.json").read_text())


def test_compare_says_whether_each_best_was_confirmed_and_published(tmp_path: Path) -> None:
    # Found by review: side by side, a best the test split did not confirm (so not
    # published) showed the same "test best" as a published one, and nothing else said so.
    store = tmp_path / "store"
    for name, plan in (("pub", {"0.0": "fix:3"}), ("over", {"0.0": "overfit:3"})):
        paths = write_toy(tmp_path / name, {**plan, "default": "noop"})
        flags = with_flag(toy_flags(paths, store), "--iterations", "1")
        done = _evolane("optimize", *flags, "--apply", "auto_verified", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    a, b = sorted(p.name for p in (store / "runs").iterdir())
    found = json.loads(_evolane("compare", a, b, "--store", str(store), "--json").stdout)
    verdicts = found["scores"]["confirmation"]
    assert verdicts["a"].startswith("confirmed (mean +0.833, p = 0.031"), verdicts
    assert verdicts["b"].startswith("unconfirmed (mean +0.000, p = 1"), verdicts
    assert found["scores"]["apply"] == {
        "a": "auto_verified: applied",
        "b": "auto_verified: unconfirmed",
    }


def test_the_runs_last_words_say_the_best_was_not_confirmed_nor_published(tmp_path: Path) -> None:
    # Found by review: the live view's last frame and `evolane watch` ended on "finished:
    # finished ... best ... val 0.333 -> 0.583" of a best the test split did not confirm and
    # the run did not publish: nothing but the summary (another terminal's) said so.
    paths = write_toy(tmp_path / "toy", {"0.0": "overfit:3", "default": "noop"})
    flags = with_flag(toy_flags(paths, tmp_path / "store"), "--iterations", "1")
    flags = with_flag(flags, "--progress", "plain")
    done = _evolane("optimize", *flags, "--apply", "auto_verified", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "] finished: finished" in line)
    entry = [lines[start]]
    entry += [line for line in lines[start + 1 :] if line.startswith("[") and "]     " in line]
    said = " ".join(line.split("]", 1)[1].strip() for line in entry)
    assert "not confirmed on the test split; apply auto_verified: unconfirmed" in said, said


def test_report_html_says_what_the_apply_did_and_that_val_is_optimistic(tmp_path: Path) -> None:
    # Found by review: report.html's summary never said whether the target was changed (a
    # publish applied, rolled back or not made: the same page) nor that the best's val score
    # was chosen on those replays, which the summary and report.md say.
    paths = write_toy(tmp_path / "toy", {"0.0": "overfit:3", "default": "noop"})
    flags = with_flag(toy_flags(paths, tmp_path / "store"), "--iterations", "1")
    done = _evolane("optimize", *flags, "--apply", "auto_verified")
    assert done.returncode == 0, done.stderr
    (page,) = (tmp_path / "store" / "runs").glob("*/report.html")
    text = html.unescape(page.read_text())
    assert "<th>apply</th><td>auto_verified: unconfirmed (the best candidate was not" in text
    assert "val fed the optimizer, and the best was chosen on these replays" in text


def test_the_summary_says_an_unconfirmed_best_was_not_published(tmp_path: Path) -> None:
    """Found by review: a best the test split did not confirm (or a run stopped before the
    confirmation) printed ``apply (auto_verified): unconfirmed`` and nothing more; report.md
    said ``not published`` and why."""
    paths = write_toy(tmp_path, {"default": "overfit:3"})
    flags = toy_flags(paths, paths["store"])
    flags += ["--iterations", "1", "--population", "1", "--apply", "auto_verified"]
    done = _evolane("optimize", *flags)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("apply (")]
    assert line.startswith("apply (auto_verified): unconfirmed: the best candidate was not"), line
    assert line.endswith("not published"), line  # the proposal's path is on its own line
    assert any(x.startswith("proposal: ") for x in done.stdout.splitlines())


def test_a_confirmed_best_only_proposed_is_not_said_to_be_published(tmp_path: Path) -> None:
    """Found by review: with ``--apply proposal`` (the default: the target untouched) a
    confirmed best's test delta said ``optimistic: published because ...`` in the summary
    and report.md."""
    paths = write_toy(tmp_path, {"default": "fix:3"})
    flags = [*toy_flags(paths, paths["store"]), "--iterations", "1", "--population", "1"]
    done = _evolane("optimize", *flags)
    assert done.returncode == 0, done.stderr
    assert "apply (proposal): proposed" in done.stdout, done.stdout
    assert "the best candidate was confirmed" in done.stdout, done.stdout
    (md,) = paths["store"].glob("runs/*/report.md")
    for text in (done.stdout, md.read_text()):
        assert "published because" not in text
        assert "optimistic: confirmed because this gain cleared the test" in text
