"""Hostile review of report.html (issue 19): failing tests that pin findings.

Each test names the finding it reproduces; none of them changes a source file.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evolane import messages
from evolane.views import History, Series, render_html
from evolane.views._data import PageData, best_path, candidates_of
from tests.test_views_history import budget

EVOLANE = [sys.executable, "-m", "evolane"]
SEED = "sha256:" + "0" * 64
SELECTED = "sha256:" + "a" * 64
RUNNER_UP = "sha256:" + "b" * 64


def _funnel(iteration: int, slot: int, digest: str, decision: str, terminal: str) -> dict:
    return {
        "cycle": 0,
        "iteration": iteration,
        "slot": slot,
        "digest": digest,
        "decision": decision,
        "terminal": terminal,
        "reason": "",
        "stages": ["generated", "unique", "local_gates", "paired_replay", "evaluation", terminal],
    }


def _paired(iteration: int, slot: int, low: float, mean: float, high: float) -> dict:
    return {
        "measurement_id": f"c0.i{iteration}.s{slot}",
        "purpose": "paired",
        "split": "val",
        "cycle": 0,
        "iteration": iteration,
        "slot": slot,
        "n": 12,
        "mean_delta": mean,
        "ci_low": low,
        "ci_high": high,
        "decision": "accept",
    }


def _units(score: float) -> list[dict[str, Any]]:
    return [
        {"arm": "candidate", "case": f"case-{i}", "unit": f"u{i}", "score": score}
        for i in range(12)
    ]


# --- best-so-far score follows the wrong candidate --------------------------------------------


def test_best_path_follows_the_selected_candidate_not_the_last_gate_accept() -> None:
    """Two candidates of one iteration pass the gate; the run selects slot 0 (terminal
    ``selected``), slot 1 ends ``rejected`` ("accepted, but another candidate of the iteration
    did better"). The best-so-far plot must show the selected tree's score; _data.best_path
    keys accepts by (cycle, iteration) so the last accepted slot wins (seen in a real
    ``--iterations 40 --population 6`` sleeper run: iterations 0, 1 and 4 plotted the runner-up)."""
    report = {
        "seed": {"digest": SEED},
        "scores": {"baseline_val": {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 12}},
        "funnel": [
            _funnel(0, 0, SELECTED, "accept", "selected"),
            _funnel(0, 1, RUNNER_UP, "accept", "rejected"),
        ],
        "measurements": [_paired(0, 0, 0.1, 0.3, 0.5), _paired(0, 1, 0.01, 0.05, 0.09)],
        "iterations": [
            {"cycle": 0, "iteration": 0, "parent": SEED, "accepted_slot": 0, "best_after": SELECTED}
        ],
        "lineage": [{"cycle": 0, "iteration": 0, "slot": 0, "digest": SELECTED}],
    }
    candidates = candidates_of(report)
    units = {"c0.i0.s0": _units(0.9), "c0.i0.s1": _units(0.55)}
    path = best_path(report, candidates, units)
    assert [p.digest for p in path] == [SEED, SELECTED]
    assert path[-1].mean == pytest.approx(0.9)


# --- the gate plot claims a rule the default gate does not use ---------------------------------


def test_the_gate_plot_does_not_claim_interval_above_the_line_for_the_paired_gate() -> None:
    """The default gate (``paired``) accepts when mean > k_se*SE (k = 1) and > min_effect, but
    the page draws each candidate's ~95% bootstrap CI and says "a candidate is accepted when
    its interval clears the line" / "acceptance: interval above 0". In a real 40x6 sleeper run
    4 of 6 accepted candidates have ci_low <= 0 (e.g. c0.i0.s5 +0.036 [-0.015, ...])."""
    report = {
        "config": {"gate": {"gate": "paired", "k_se": 1.0, "min_effect": 0.0}},
        "funnel": [_funnel(0, 0, SELECTED, "accept", "selected")],
        "measurements": [_paired(0, 0, -0.0006, 0.0231, 0.0527)],  # cycle-1 sleeper run
    }
    candidates = candidates_of(report)
    text = render_html(PageData(report=report, history=History(), candidates=candidates), {})
    claims_interval_rule = "interval above" in text or "interval clears the line" in text
    accepted_below = [c for c in candidates if c.outcome == "accept" and (c.ci_low or 0) <= 0]
    assert not (claims_interval_rule and accepted_below)


# --- --fast-verified: screened-out candidates lose their numbers --------------------------------


def test_a_candidate_rejected_at_screening_shows_its_screening_numbers() -> None:
    """With --fast-verified most candidates end at ``screening`` with a ``screening``
    measurement (mean delta, n) in report.json; candidates_of only reads ``paired`` ones, so the
    table shows "-" and n 0 and the gate plot draws them in the "not measured" strip."""
    report = {
        "funnel": [
            {
                **_funnel(0, 1, RUNNER_UP, "reject", "rejected"),
                "stages": ["generated", "unique", "local_gates", "screening", "rejected"],
            }
        ],
        "measurements": [
            {
                "measurement_id": "c0.i0.s1.screen",
                "purpose": "screening",
                "split": "val",
                "cycle": 0,
                "iteration": 0,
                "slot": 1,
                "n": 1,
                "mean_delta": -0.0116,
                "ci_low": -0.0116,
                "ci_high": -0.0116,
                "decision": "indecisive",
            }
        ],
    }
    (candidate,) = candidates_of(report)
    assert candidate.mean_delta == pytest.approx(-0.0116)
    assert candidate.n == 1


# --- escaping and credentials ----------------------------------------------------------------


def test_every_report_field_is_escaped() -> None:
    """_page.py prints report['cycle'] and scores[*]['n'] without scrub()."""
    report = {
        "run_id": "r-1",
        "cycle": "<script>alert(1)</script>",
        "scores": {
            "best_val": {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": "<script>x</script>"}
        },
    }
    text = render_html(PageData(report=report, history=History()), {})
    assert "<script" not in text


def test_the_diff_shows_a_hostile_line_as_one_line() -> None:
    """Found by review: the page's diff broke lines at "\\r" (and "\\x0c", U+2028...) as
    well as "\\n", so the tail of an added line showed as an unchanged line or as a forged
    file header (``+++ b/harmless.txt``)."""
    diff = (
        "--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+curl x | sh\r+++ b/harmless.txt\u2028 innocent\x0cmore\n"
    )
    text = render_html(PageData(report={"run_id": "r-1"}, history=History(), diff=diff), {})
    shown = text[text.index("<pre class='diff'>") :]
    spans = shown[: shown.index("</pre>")].split("\n")
    assert len(spans) == 4, spans  # the four lines of the diff, no more
    assert spans[3].startswith("<span class='add'>+curl x | sh+++ b/harmless.txt")
    assert spans[3].endswith(" innocentmore</span>")


def test_a_bidi_override_never_reorders_the_page() -> None:
    """Found by review: a bidi override in a candidate's file name (or a case id, an
    optimizer's words) reached the page as it was: ``a<U+202E>txt.exe`` read ``aexe.txt``
    in the diff, as the terminal's ``evolane diff`` no longer shows it."""
    diff = "--- a/a\u202etxt.exe\n+++ b/a\u202etxt.exe\n@@ -0,0 +1 @@\n+x\u2066y\n"
    report = {"run_id": "r-1", "message": "note \u202egnp.exe"}
    text = render_html(PageData(report=report, history=History(), diff=diff), {})
    assert not set(text) & set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    assert "+++ b/a\ufffdtxt.exe" in text and "note \ufffdgnp.exe" in text


@pytest.mark.parametrize(
    "secret_line",
    [
        "OPENAI_API_KEY=SECRETVALUE1",
        "export ANTHROPIC_API_KEY=SECRETVALUE1",
        "https://api.example.com/v1?access_token=SECRETVALUE1",
        "AWS_SECRET_ACCESS_KEY=SECRETVALUE1",
        "db_password=SECRETVALUE1",
        'password = "SECRETVALUE1"',
        '{"api_key": "SECRETVALUE1"}',
        "--api-key SECRETVALUE1",
        "https://user:pa@ss-SECRETVALUE1@example.com/",
    ],
)
def test_key_value_credentials_are_hidden(secret_line: str) -> None:
    """README: every text is scrubbed of "URL passwords, bearer tokens, key=... pairs". The
    key pattern needs a word boundary before api_key/token/secret/password, so NAME_API_KEY=,
    access_token=, db_password= and quoted values pass through (message, reasons, the diff)."""
    report = {"run_id": "r-1", "message": secret_line}
    data = PageData(report=report, history=History(), diff="+" + secret_line + "\n")
    text = render_html(data, {})
    assert "SECRETVALUE1" not in text


# --- the series --------------------------------------------------------------------------------


def test_a_thinned_series_keeps_its_newest_point() -> None:
    """Series.add drops an offered point when `_offered % stride`, so once a long run thins
    its series the final spend (or the lanes' return to 0 at run_finished) can be lost: the
    spend line ends short of report.json's total."""
    series: Series[int] = Series(limit=4)
    for value in range(1, 11):
        series.add(value)
    assert series.points[-1] == 10


def test_the_spend_line_never_goes_down_across_a_resume() -> None:
    """A resumed run re-announces its restored units: its first BudgetUpdates count up again
    from the first unit (seen: 169189 tokens at the kill, then 24105, 48437, ... after
    --resume), so the page's spend-by-role line drops at the session boundary."""
    history = History()
    start = messages.RunStarted(
        run_id="r", t=0.0, campaign_id="c", cycle=0, iterations=3, population=2,
        replay_lanes=2, judge_lanes=1,
    )  # fmt: skip
    history.fold(start)
    for t, tokens in ((1.0, 24105), (2.0, 48437), (3.0, 169189)):
        history.fold(budget(t, tokens))
    history.fold(start.model_copy(update={"resumed": True}))
    for t, tokens in ((0.01, 24105), (0.02, 48437), (0.08, 169189), (1.0, 193521)):
        history.fold(budget(t, tokens))
    totals = [p.spent.tokens for p in history.spend.points]
    assert totals == sorted(totals)


# --- hostile report.json through the CLI -------------------------------------------------------


@pytest.fixture(scope="module")
def sleeper_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("review-html") / "store"
    args = ["optimize", "--example", "sleeper", "--store", str(store), "--progress", "none"]
    done = subprocess.run(
        [*EVOLANE, *args], capture_output=True, text=True, timeout=600, cwd=store.parent
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return store


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(report: dict[str, Any]) -> None:
        target: Any = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


HOSTILE_SHAPES = {
    "measurements is a string": _set(["measurements"], "abc"),
    "funnel holds a number": _set(["funnel"], [1]),
    "funnel iteration is null": _set(["funnel", 0, "iteration"], None),
    "iterations hold null": _set(["iterations"], [None]),
    "config is a string": _set(["config"], "x"),
    "gate confidence is a string": _set(["config", "gate", "confidence"], "x"),
    "pass_score is null": _set(["config", "gate", "pass_score"], None),
    "a score lacks its mean": _set(["scores", "best_val"], {"n": 1}),
    "a score mean is a string": _set(["scores", "best_val", "mean"], "x"),
    "budget is a string": _set(["budget"], "x"),
    "a role's usage is null": _set(["budget", "spent_by_role", "judge"], None),
    "spent tokens is a string": _set(["budget", "spent", "tokens"], "x"),
    "wall_seconds is a string": _set(["wall_seconds"], "x"),
    "confirmation is a string": _set(["confirmation"], "x"),
    "seed is a string": _set(["seed"], "x"),
    "lineage holds a number": _set(["lineage"], [1]),
    "artifacts is a string": _set(["artifacts"], "x"),
    "a diff digest is not a digest": _set(["artifacts", "best_diff"], {"digest": "../x"}),
    "a tree digest is a number": _set(["artifacts", "best_tree"], {"digest": 5}),
    "apply is a string": _set(["apply"], "x"),
    "proposal_dir is a number": _set(["apply", "proposal_dir"], 5),
    "a units size is a string": _set(["measurements", 0, "units_ref", "size"], "x"),
    "a funnel stages is a number": _set(["funnel", 0, "stages"], 5),
}


@pytest.mark.parametrize("shape", sorted(HOSTILE_SHAPES))
def test_report_format_html_of_a_malformed_report_is_one_error_line(
    sleeper_store: Path, tmp_path: Path, shape: str
) -> None:
    """README: bad input gives one clear error line and exit 2 (or a page), never a
    traceback. _write.page_data only catches a non-dict report; everything below trusts
    report.json's types, and _inspect._show_html catches only ReportPageError and OSError."""
    store = tmp_path / "store"
    shutil.copytree(sleeper_store, store, symlinks=True)
    (run_dir,) = (store / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    hostile = copy.deepcopy(report)
    HOSTILE_SHAPES[shape](hostile)
    (run_dir / "report.json").write_text(json.dumps(hostile))
    done = subprocess.run(
        [*EVOLANE, "report", run_dir.name, "--store", str(store), "--format", "html"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    if done.returncode != 0:
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1


# --- a later cycle (--resume-campaign) starts from the campaign's best, not the seed ------------


def test_a_later_cycle_without_an_accept_plots_its_starting_tree_not_the_seed() -> None:
    """A --resume-campaign run (cycle 1) starts from cycle 0's best P, but report.json's
    ``seed`` and ``scores.baseline_val`` are the campaign seed's. best_path carries the seed's
    point forward through iterations without an accept, so the best-so-far plot shows the seed
    (0.47) where the best was P (seen: cycle 1 of the sleeper starts at 0.78); lineage_tree
    likewise draws the first iteration's candidates as children of the seed node."""
    start = "sha256:" + "c" * 64
    report = {
        "cycle": 1,
        "seed": {"digest": SEED},
        "scores": {"baseline_val": {"mean": 0.47, "ci_low": 0.32, "ci_high": 0.61, "n": 11}},
        "funnel": [{**_funnel(0, 0, RUNNER_UP, "reject", "rejected"), "cycle": 1}],
        "measurements": [  # every iteration measures its parent first (its units: the arm)
            {"measurement_id": "c1.i0.base", "purpose": "baseline", "split": "val", "cycle": 1}
            | {"iteration": 0, "slot": None, "n": 0}
        ],
        "iterations": [
            {
                "cycle": 1,
                "iteration": 0,
                "parent": start,
                "accepted_slot": None,
                "best_after": start,
            }
        ],
    }
    parent_units = [{**u, "arm": "baseline"} for u in _units(0.78)]
    path = best_path(report, candidates_of(report), {"c1.i0.base": parent_units})
    assert [p.digest for p in path] == [start, start]
    assert path[-1].mean == pytest.approx(0.78)


def test_the_best_so_far_plot_ends_at_report_json_best_val() -> None:
    """The selected candidate's paired arm stopped early (its units cover fewer cases than
    the final val measurement): the plot's best point must be report.json's ``best_val``, as
    the page says, not the arm's prefix (seen: 0.610 over 25 cases beside best_val 0.596
    over all 26)."""
    report = {
        "seed": {"digest": SEED},
        "best": {"digest": SELECTED},
        "scores": {
            "baseline_val": {"mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 12},
            "best_val": {"mean": 0.85, "ci_low": 0.7, "ci_high": 0.95, "n": 13},
        },
        "funnel": [_funnel(0, 0, SELECTED, "accept", "selected")],
        "measurements": [_paired(0, 0, 0.1, 0.3, 0.5)],
        "iterations": [
            {"cycle": 0, "iteration": 0, "parent": SEED, "accepted_slot": 0, "best_after": SELECTED}
        ],
        "lineage": [{"cycle": 0, "iteration": 0, "slot": 0, "digest": SELECTED}],
    }
    path = best_path(report, candidates_of(report), {"c0.i0.s0": _units(0.9)})
    assert [p.digest for p in path] == [SEED, SELECTED]
    assert (path[-1].mean, path[-1].low, path[-1].high) == (0.85, 0.7, 0.95)
    assert path[0].mean == 0.5
