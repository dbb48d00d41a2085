"""The report page's plots, each an ``<svg>`` string drawn from `PageData` (pure).

Colours come from CSS classes of the page's stylesheet: ``accept``, ``reject``,
``indecisive``, ``gated_out`` for outcomes; ``role-*`` for roles; ``solid`` /
``always_failing`` / ``flaky`` / ``infra_errored`` for heatmap cells.
"""

from __future__ import annotations

from typing import Any

from evolane.views._data import GATED_OUT, Candidate, PageData
from evolane.views._history import History
from evolane.views._svg import Plot, fmt_number, span

WIDTH, HEIGHT = 640, 260
ROLES = ("optimizer", "replay", "judge")
MAX_TIP = 160
"""Characters of a reason a tooltip shows (the table has it whole)."""
MAX_HEAT_ROWS = 120
"""Cases the heatmap draws at most (the rest are counted below it)."""


def _tip(c: Candidate) -> str:
    delta = "not measured" if c.mean_delta is None else f"delta {c.mean_delta:+.4f}"
    ci = ""
    if c.ci_low is not None and c.ci_high is not None:
        ci = f" [{c.ci_low:+.4f}, {c.ci_high:+.4f}] n={c.n}"
    where = f"cycle {c.cycle} iteration {c.iteration} slot {c.slot} {c.digest[:19]}"
    reason = c.reason if len(c.reason) <= MAX_TIP else c.reason[: MAX_TIP - 1] + "…"
    return f"{where}: {c.outcome}, {delta}{ci}. {reason}"


def score_vs_iteration(data: PageData) -> str:
    """Best-so-far val score with its CI band, by iteration (-1 is the seed)."""
    points = data.best_path
    xs = [float(p.iteration) for p in points] or [0.0]
    plot = Plot(
        WIDTH,
        HEIGHT,
        span(xs, 0.03),
        span([v for p in points for v in (p.low, p.high)], floor=None),
    )
    plot.axes("iteration (-1: the seed)", "best val score")
    plot.band(
        [(p.iteration, p.low) for p in points], [(p.iteration, p.high) for p in points], "band"
    )
    plot.line([(p.iteration, p.mean) for p in points], "best", step=True)
    for p in points:
        tip = f"iteration {p.iteration}: {p.mean:.4f} [{p.low:.4f}, {p.high:.4f}] {p.digest[:19]}"
        plot.dot(p.iteration, p.mean, "best-dot", tip, r=3)
    return plot.svg("best-so-far val score against iteration")


def spend_axis(history: History, report: dict[str, Any]) -> tuple[str, str]:
    """Which spend the x axes use: dollars when any were spent or capped, else tokens."""
    spent = (report.get("budget") or {}).get("spent") or {}
    ceilings = (report.get("budget") or {}).get("ceilings") or {}
    if (spent.get("cost_usd") or 0) > 0 or ceilings.get("cost_usd"):
        return "cost_usd", "spent (USD)"
    return "tokens", "spent (tokens)"


def score_vs_spend(data: PageData) -> str:
    """Best-so-far val score against what had been spent when each accept was decided."""
    dim, label = spend_axis(data.history, data.report)
    accepts = {
        (d.event.iteration, d.event.digest): (getattr(d.spent, dim, None) or 0.0)
        if d.spent
        else 0.0
        for d in data.history.decisions
        if d.event.decision == "accept"
    }
    series: list[tuple[float, float, float, float]] = []
    for index, p in enumerate(data.best_path):
        fresh = index == 0 or p.digest != data.best_path[index - 1].digest
        if not fresh:
            continue
        x = 0.0 if p.iteration < 0 else accepts.get((p.iteration, p.digest))
        if x is not None:
            series.append((x, p.mean, p.low, p.high))
    total = ((data.report.get("budget") or {}).get("spent") or {}).get(dim) or 0.0
    if series:
        series.append((max(total, series[-1][0]), *series[-1][1:]))
    xs = [s[0] for s in series] or [0.0, 1.0]
    plot = Plot(WIDTH, HEIGHT, span(xs, 0.03, floor=0.0), span([v for s in series for v in s[2:]]))
    plot.axes(label, "best val score")
    plot.band([(s[0], s[2]) for s in series], [(s[0], s[3]) for s in series], "band")
    plot.line([(s[0], s[1]) for s in series], "best", step=True)
    for s in series[:-1]:
        plot.dot(s[0], s[1], "best-dot", f"{label} {fmt_number(s[0])}: {s[1]:.4f}", r=3)
    return plot.svg("best-so-far val score against spend")


def gate_rule(report: dict[str, Any]) -> tuple[str, float, float, str]:
    """The gate in force: (gate, k, line, rule in words). ``paired`` draws mean +- k*SE and
    the line its lower end must clear (0; the mean must also clear min_effect);
    ``bootstrap`` draws the CI and min_effect, the line its lower end must clear; the
    others draw the CI for reference only."""
    gate = (report.get("config") or {}).get("gate") or {}
    name = str(gate.get("gate") or "paired")
    k, floor = float(gate.get("k_se") or 1.0), float(gate.get("min_effect") or 0.0)
    if name == "paired":
        words = f"accepted when mean - {k:g} x SE > 0" + (
            f" and mean > {floor:g}" if floor > 0 else ""
        )
        return name, k, 0.0, words
    if name == "bootstrap":
        return name, k, floor, f"accepted when the bootstrap interval's lower end > {floor:g}"
    if name == "strict":
        return name, k, 0.0, "accepted when no case is worse and one is better (interval shown)"
    threshold = float(gate.get("threshold") or 0.0)
    return name, k, 0.0, f"accepted when the mean score >= {threshold:g} and mean delta > 0"


def _bar(c: Candidate, gate: str, k: float) -> tuple[float, float] | None:
    if c.mean_delta is None:
        return None
    if gate == "paired" and c.se is not None:
        return c.mean_delta - k * c.se, c.mean_delta + k * c.se
    if c.ci_low is not None and c.ci_high is not None:
        return c.ci_low, c.ci_high
    return None


def gate_plot(data: PageData) -> str:
    """Each candidate's mean delta with the bar the gate read, against its line."""
    gate, k, line, words = gate_rule(data.report)
    cands = data.candidates
    bars = [_bar(c, gate, k) for c in cands]
    values = [v for bar in bars if bar for v in bar]
    values += [c.mean_delta for c in cands if c.mean_delta is not None]
    low, high = span([*values, line, 0.0], 0.08)
    floor = low - (high - low) * 0.06
    plot = Plot(WIDTH, HEIGHT, (-0.5, max(len(cands), 1) - 0.5), (floor, high))
    plot.axes("candidate (in order proposed)", "mean delta vs parent", lambda x: f"{x:.0f}")
    plot.hline(0.0, "zero")
    plot.hline(line, "accept-line", words if gate in ("paired", "bootstrap") else "")
    for index, (c, bar) in enumerate(zip(cands, bars, strict=True)):
        if c.mean_delta is None:
            plot.dot(index, floor + (low - floor) / 2, f"mark {c.outcome}", _tip(c), r=3)
            continue
        if bar is not None:
            plot.bar(index, bar[0], bar[1], f"err {c.outcome}", _tip(c))
        plot.dot(index, c.mean_delta, f"mark {c.outcome}", _tip(c))
    return plot.svg("gate plot: mean delta and the gate's bar per candidate")


def lineage_tree(data: PageData) -> str:
    """Parents to candidates by iteration; the accepted path drawn bold."""
    cands = data.candidates
    iterations = data.report.get("iterations") or []
    seed = str((data.report.get("seed") or {}).get("digest") or "")
    root = str(iterations[0].get("parent") or seed) if iterations else seed
    root_name = "seed" if root == seed else "start"
    path = {str(e.get("digest")) for e in data.report.get("lineage") or []}
    columns = sorted({(c.cycle, c.iteration) for c in cands})
    col_of = {key: index + 1 for index, key in enumerate(columns)}
    rows = max([c.slot for c in cands], default=0) + 1
    plot = Plot(
        WIDTH, max(120, min(600, 26 * rows + 60)), (-0.5, len(columns) + 0.5), (rows - 0.5, -0.8)
    )
    plot.left, plot.bottom = 16, 24
    where: dict[str, tuple[float, float]] = {root: (0.0, 0.0)}
    for c in cands:
        if c.outcome == "accept" and c.digest:
            where.setdefault(c.digest, (col_of[(c.cycle, c.iteration)], c.slot))
    for c in cands:
        x, y = col_of[(c.cycle, c.iteration)], c.slot
        px, py = where.get(c.parent, (x - 1, 0))
        cls = "edge path" if c.digest in path and c.outcome == "accept" else "edge"
        plot.line([(px, py), (x, y)], cls)
    plot.dot(0, 0, "node seed", f"{root_name} {root[:19]}", r=6)
    for c in cands:
        cls = f"node {c.outcome}" + (" on-path" if c.digest in path else "")
        plot.dot(col_of[(c.cycle, c.iteration)], c.slot, cls, _tip(c), r=5)
    for (cycle, iteration), col in col_of.items():
        label = f"i{iteration}" if cycle == 0 else f"c{cycle}i{iteration}"
        plot.text(plot.x(col), plot.height - 6, label, "tick mid")
    plot.text(plot.x(0), plot.height - 6, root_name, "tick mid")
    return plot.svg("lineage tree of the candidates")


def funnel_counts(report: dict[str, Any]) -> dict[tuple[int, int], list[int]]:
    """Per (cycle, iteration): proposed, passed the local gates, measured, accepted."""
    measured_stages = {"screening", "paired_replay", "evaluation"}
    counts: dict[tuple[int, int], list[int]] = {}
    for entry in report.get("funnel") or []:
        row = counts.setdefault((int(entry.get("cycle") or 0), int(entry["iteration"])), [0] * 4)
        stages = set(entry.get("stages") or [])
        decision = entry.get("decision")
        row[0] += 1
        reached = bool(stages & measured_stages)
        row[1] += reached
        row[2] += reached and entry.get("terminal") != "not_run"
        row[3] += decision == "accept"
    return counts


FUNNEL_STEPS = ("proposed", "passed gates", "measured", "accepted")


def funnel_bars(data: PageData) -> str:
    """Grouped bars per iteration: proposed, passed gates, measured, accepted."""
    counts = funnel_counts(data.report)
    keys = sorted(counts)
    top = max([max(row) for row in counts.values()], default=1)
    plot = Plot(WIDTH, HEIGHT, (-0.5, max(len(keys), 1) - 0.5), (0, top * 1.1 + 0.1))
    plot.axes("iteration", "candidates", lambda x: _iteration_label(keys, x))
    for index, key in enumerate(keys):
        for step, value in enumerate(counts[key]):
            x0 = index - 0.4 + step * 0.2
            tip = f"iteration {key[1]}: {value} {FUNNEL_STEPS[step]}"
            plot.rect((x0, x0 + 0.18), (0, value), f"funnel-{step}", tip)
    return plot.svg("funnel per iteration")


def _iteration_label(keys: list[tuple[int, int]], x: float) -> str:
    index = round(x)
    return str(keys[index][1]) if 0 <= index < len(keys) and abs(x - index) < 1e-6 else ""


def heatmap(data: PageData) -> str:
    """Cases x iterations, each cell the parent's standing on the case then (and the final
    best's), coloured solid / always_failing / flaky / infra_errored."""
    cases = sorted(data.heatmap)[:MAX_HEAT_ROWS]
    columns = data.columns
    height = max(80, min(1600, 12 * len(cases) + 60))
    plot = Plot(WIDTH, height, (0, max(len(columns), 1)), (len(cases), 0))
    plot.left, plot.bottom = 110, 30
    for row, case in enumerate(cases):
        plot.text(plot.left - 4, plot.y(row + 0.5) + 4, case[:18], "tick end")
        for col, column in enumerate(columns):
            kind = data.heatmap[case].get(column)
            if kind is None:
                continue
            mean = data.heat_scores.get(case, {}).get(column, 0.0)
            tip = f"{case} at {column}: {kind.replace('_', ' ')}, mean score {mean:.3f}"
            plot.rect((col + 0.04, col + 0.96), (row + 0.08, row + 0.92), f"cell {kind}", tip)
    for col, column in enumerate(columns):
        plot.text(plot.x(col + 0.5), height - 12, column, "tick mid")
    more = len(data.heatmap) - len(cases)
    if more > 0:
        plot.text(4, height - 2, f"and {more} more cases (report.json has them all)", "label")
    return plot.svg("cases by iterations heatmap")


def spend_lines(history: History, report: dict[str, Any]) -> str:
    """Spend by role over the run's clock, against the ceiling."""
    dim, label = spend_axis(history, report)
    points = history.spend.points
    ceiling = ((report.get("budget") or {}).get("ceilings") or {}).get(dim)
    values = [getattr(u, dim) or 0.0 for p in points for u in p.by_role.values()]
    totals = [getattr(p.spent, dim) or 0.0 for p in points]
    xs = [p.clock for p in points] or [0.0, 1.0]
    plot = Plot(
        WIDTH,
        HEIGHT,
        span(xs, 0.02, floor=0.0),
        span([*values, *totals, *([ceiling] if ceiling else [])], floor=0.0),
    )
    plot.axes("run clock (s)", label)
    plot.line([(p.clock, getattr(p.spent, dim) or 0.0) for p in points], "role-total", step=True)
    for role in ROLES:
        series = [(p.clock, getattr(p.by_role.get(role), dim, None) or 0.0) for p in points]
        plot.line(series, f"role-{role}", step=True)
    if ceiling:
        plot.hline(ceiling, "ceiling", f"ceiling {fmt_number(ceiling)}")
    return plot.svg("spend by role over time")


def lane_lines(history: History) -> str:
    """Busy replay lanes, units being judged and proposals awaited over the run's clock."""
    points = history.lanes.points
    xs = [p.clock for p in points] or [0.0, 1.0]
    top = max([max(p.replay, p.judge, p.optimizer) for p in points], default=1)
    plot = Plot(WIDTH, HEIGHT, span(xs, 0.02, floor=0.0), (0, top * 1.1 + 0.5))
    plot.axes("run clock (s)", "busy")
    plot.line([(p.clock, p.replay) for p in points], "role-replay", step=True)
    plot.line([(p.clock, p.judge) for p in points], "role-judge", step=True)
    plot.line([(p.clock, p.optimizer) for p in points], "role-optimizer", step=True)
    return plot.svg("lane occupancy over time")


OUTCOMES = ("accept", "reject", "indecisive", GATED_OUT)
