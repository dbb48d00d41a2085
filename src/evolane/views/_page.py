"""``report.html``: one self-contained page (inline CSS and SVG, no script, nothing fetched).

`render_html` is pure: `PageData` in, the page out. Every text is escaped and scrubbed of
credentials (`scrub`); artifacts are linked by
their path in the store, never inlined.
"""

from __future__ import annotations

from typing import Any

from evolane.views import _panels as panels
from evolane.views._data import Candidate, CaseChange, PageData
from evolane.views._scrub import scrub
from evolane.views._style import STYLE


def _num(value: Any, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _wall(report: dict[str, Any]) -> str:
    """The run's wall: a resumed run's over all its sessions, then this one's (as
    `Report.wall_text` words it)."""
    session, total, resumed = (
        report.get(k) for k in ("wall_seconds", "run_wall_seconds", "resumed")
    )
    if not isinstance(resumed, int) or resumed <= 0 or total is None:
        return f"{_num(total if total is not None else session, '.1f')} s"
    return f"{_num(total, '.1f')} s over {resumed + 1} sessions ({_num(session, '.1f')} s this one)"


def _optimistic(report: dict[str, Any]) -> list[str]:
    """The caveat on the best's val score the summary and report.md give: it was chosen on
    those replays (and val fed the optimizer, when it did)."""
    if not report.get("selected"):
        return []
    splits = report.get("splits")
    fed = isinstance(splits, dict) and splits.get("feedback") == "val"
    said = "val fed the optimizer, and " if fed else ""
    said += "the best was chosen on these replays: its val score is optimistic"
    return [f"<tr><th>note</th><td>{scrub(said)}</td></tr>"]


def _score_row(name: str, score: dict[str, Any] | None) -> str:
    if not score:
        return f"<tr><th>{name}</th><td>n/a</td></tr>"
    text = scrub(
        f"{score['mean']:.4f} [{score['ci_low']:.4f}, {score['ci_high']:.4f}] (n={score['n']})"
    )
    return f"<tr><th>{name}</th><td class='num'>{text}</td></tr>"


def _summary(report: dict[str, Any]) -> str:
    scores = report.get("scores") or {}
    rows = [
        f"<tr><th>status</th><td>{scrub(report.get('status'))} "
        f"(campaign {scrub(report.get('campaign_status'))})</td></tr>",
        *(
            _score_row(k.replace("_", " "), scores.get(k))
            for k in ("baseline_val", "best_val", "baseline_test", "best_test")
        ),
        *_optimistic(report),
        f"<tr><th>wall</th><td class='num'>{scrub(_wall(report))}</td></tr>",
    ]
    confirmation = report.get("confirmation") or {}
    if confirmation.get("sentence"):
        rows.append(f"<tr><th>confirmation</th><td>{scrub(confirmation['sentence'])}</td></tr>")
    if report.get("error_control"):
        rows.append(f"<tr><th>error control</th><td>{scrub(report['error_control'])}</td></tr>")
    apply = report.get("apply")
    if isinstance(apply, dict):  # found by review: the page never said if the target changed
        said = f"{apply.get('policy')}: {apply.get('status')}"
        said += f" ({apply['message']})" if apply.get("message") else ""
        rows.append(f"<tr><th>apply</th><td>{scrub(said)}</td></tr>")
    if report.get("message"):
        rows.append(f"<tr><th>message</th><td>{scrub(report['message'])}</td></tr>")
    rows += _preflight(report)
    return f"<table class='summary'>{''.join(rows)}</table>"


def _preflight(report: dict[str, Any]) -> list[str]:
    """A row for each line the run's start said (report.json's ``estimate.preflight``: the
    gate's reach, copies of the val/test cases masked or readable; report.md's lines)."""
    estimate = report.get("estimate")
    said = estimate.get("preflight") if isinstance(estimate, dict) else None
    lines = [line for line in said if isinstance(line, str)] if isinstance(said, list) else []
    return [f"<tr><th>preflight</th><td>{scrub(line)}</td></tr>" for line in lines]


def _budget(report: dict[str, Any]) -> str:
    budget = report.get("budget") or {}
    ceilings = budget.get("ceilings") or {}
    rows = ["<tr><th>role</th><th>tokens</th><th>USD</th><th>wall s</th></tr>"]
    for role, usage in sorted((budget.get("spent_by_role") or {}).items()):
        rows.append(
            f"<tr><td>{scrub(role)}</td><td class='num'>{_num(usage.get('tokens'), '.0f')}</td>"
            f"<td class='num'>{_num(usage.get('cost_usd'))}</td>"
            f"<td class='num'>{_num(usage.get('wall_seconds'), '.1f')}</td></tr>"
        )
    spent = budget.get("spent") or {}
    rows.append(
        f"<tr class='total'><td>total</td><td class='num'>{_num(spent.get('tokens'), '.0f')}</td>"
        f"<td class='num'>{_num(spent.get('cost_usd'))}</td>"
        f"<td class='num'>{_num(spent.get('wall_seconds'), '.1f')}</td></tr>"
        f"<tr><td>ceiling</td><td class='num'>{_num(ceilings.get('tokens'), '.0f')}</td>"
        f"<td class='num'>{_num(ceilings.get('cost_usd'))}</td>"
        f"<td class='num'>{_num(ceilings.get('wall_seconds'), '.1f')}</td></tr>"
    )
    return f"<table class='budget'>{''.join(rows)}</table>"


def _candidate_row(c: Candidate) -> str:
    ci = "-" if c.ci_low is None else f"[{c.ci_low:+.4f}, {_num(c.ci_high, '+.4f')}]"
    return (
        f"<tr class='{c.outcome}' data-digest='{scrub(c.digest)}'>"
        f"<td>{c.cycle}</td><td>{c.iteration}</td><td>{c.slot}</td>"
        f"<td title='{scrub(c.digest)}'><code>{scrub(c.digest[7:19])}</code></td>"
        f"<td>{scrub(c.terminal)}</td><td class='outcome'>{scrub(c.outcome)}</td>"
        f"<td class='num'>{_num(c.mean_delta, '+.4f')}</td><td class='num'>{ci}</td>"
        f"<td class='num'>{c.n}</td><td>{scrub(c.reason)}</td></tr>"
    )


def _candidates(data: PageData) -> str:
    head = (
        "<tr><th>cycle</th><th>iteration</th><th>slot</th><th>digest</th><th>reached</th>"
        "<th>outcome</th><th>mean delta</th><th>interval</th><th>n</th><th>reason</th></tr>"
    )
    rows = "".join(_candidate_row(c) for c in data.candidates)
    return f"<table class='candidates'>{head}{rows}</table>"


def _changes(data: PageData) -> str:
    parts: list[str] = []
    for measurement, changes in data.changes.items():
        rows = "".join(_change_row(change) for change in changes)
        parts.append(
            f"<h3>{scrub(measurement)}</h3><table class='cases'><tr><th>case</th>"
            f"<th>before</th><th>after</th><th>change</th></tr>{rows}</table>"
        )
    return "".join(parts) or "<p>No candidate was accepted.</p>"


def _change_row(change: CaseChange) -> str:
    moved = None
    if change.before is not None and change.after is not None:
        moved = change.after - change.before
    cls = "" if moved is None or abs(moved) < 1e-12 else ("up" if moved > 0 else "down")
    return (
        f"<tr class='{cls}'><td>{scrub(change.case)}</td><td class='num'>{_num(change.before)}</td>"
        f"<td class='num'>{_num(change.after)}</td><td class='num'>{_num(moved, '+.4f')}</td></tr>"
    )


def _diff(data: PageData) -> str:
    if not data.diff:
        return "<p>The best tree is the seed: no change.</p>"
    lines = []
    # Lines end at "\n" only, as a patch tool reads them: `splitlines` also broke at "\r",
    # "\x0c", "\x85" or U+2028 inside an added line, and showed its tail as an unchanged
    # line or as a forged "+++ b/..." header (found by review).
    for line in data.diff.removesuffix("\n").split("\n"):
        cls = "add" if line.startswith("+") else "del" if line.startswith("-") else ""
        cls = "hunk" if line.startswith("@@") else cls
        lines.append(f"<span class='{cls}'>{scrub(line)}</span>")
    cut = "<p class='note'>The diff is cut here; the whole one is linked below.</p>"
    return f"<pre class='diff'>{chr(10).join(lines)}</pre>" + (cut if data.diff_cut else "")


def _legend(rule: str) -> str:
    keys = "".join(f"<span class='key {o}'>{o.replace('_', ' ')}</span>" for o in panels.OUTCOMES)
    return f"<p class='legend'>{keys} <span class='rule'>{scrub(rule)}</span></p>"


def _artifacts(links: dict[str, str]) -> str:
    items = "".join(
        f"<li>{scrub(name)}: <a href='{scrub(path)}'><code>{scrub(path)}</code></a></li>"
        for name, path in links.items()
    )
    return f"<ul class='artifacts'>{items}</ul>" if items else "<p>none</p>"


def _section(anchor: str, title: str, body: str, caption: str = "") -> str:
    note = f"<p class='caption'>{scrub(caption)}</p>" if caption else ""
    return f"<section id='{anchor}'><h2>{scrub(title)}</h2>{note}{body}</section>"


TITLES = {
    "score": "Best-so-far val score",
    "gate": "The gate",
    "lineage": "Lineage",
    "funnel": "Funnel",
    "heatmap": "Cases by iteration",
    "spend": "Spend by role",
    "lanes": "Lane occupancy",
}
CAPTIONS = {
    "score": "The best tree's mean val score with its interval (report.json's method; the seed "
    "and the final best at report.json's figures), by iteration and by spend when each accept "
    "was decided.",
    "gate": "Each candidate's mean delta against its parent with the bar the gate read "
    "(hover for its reason; an early decision may come from the sequential test).",
    "lineage": "Parents to candidates by iteration; the accepted path is bold.",
    "funnel": "Per iteration: " + ", ".join(panels.FUNNEL_STEPS) + ".",
    "heatmap": "The parent's standing on each val case at each iteration, and the final "
    "best's: solid, always failing, flaky, infrastructure error.",
    "spend": "Total (grey), optimizer, replay and judge against the ceiling.",
    "lanes": "Replay lanes busy, units being judged, proposals awaited.",
}


def render_html(data: PageData, links: dict[str, str]) -> str:
    """The whole page for one run (``links``: artifact name to its store path, relative to
    the run's directory)."""
    report = data.report
    run_id = scrub(report.get("run_id") or "")
    plots = {
        "score": panels.score_vs_iteration(data) + panels.score_vs_spend(data),
        "gate": _legend(panels.gate_rule(report)[3]) + panels.gate_plot(data),
        "lineage": panels.lineage_tree(data),
        "funnel": panels.funnel_bars(data),
        "heatmap": panels.heatmap(data),
        "spend": panels.spend_lines(data.history, report),
        "lanes": panels.lane_lines(data.history),
    }
    sections = [
        _section("summary", "Result", _summary(report) + _budget(report)),
        *(_section(key, TITLES[key], body, CAPTIONS[key]) for key, body in plots.items()),
        _section("candidates", "Every candidate", _candidates(data)),
        _section("cases", "Accepted candidates, case by case", _changes(data)),
        _section("diff", "Seed to best", _diff(data)),
        _section("artifacts", "Artifacts in the store", _artifacts(links)),
    ]
    notes = "".join(f"<li>{scrub(n)}</li>" for n in data.notes)
    campaign = (
        f"{scrub(report.get('campaign_id') or '')}</code>, cycle {scrub(report.get('cycle', 0))}"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>evolane report {run_id}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>evolane report <code>{run_id}</code></h1><p>campaign "
        f"<code>{campaign}</p></header>"
        f"<main>{''.join(sections)}</main>"
        + (f"<footer><ul class='notes'>{notes}</ul></footer>" if notes else "")
        + "</body></html>\n"
    )
