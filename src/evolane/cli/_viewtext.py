"""The live view's words: text fitted to a width, the gate's rule with its numbers, the
scores and their sparkline, the isolation and the spend, as a person reads them.

Lines are built from *segments* (a few words that belong together) and `pack`ed to a
width: a segment never breaks; one that does not fit starts an indented line, and one
longer than a whole line loses whole trailing words (``…``) or, for a digest or a path,
its middle. So no line is ever wider than the terminal and none wraps mid-word.
"""

from __future__ import annotations

import re

from rich.cells import cell_len

from evolane import messages
from evolane.cli._amounts import amount
from evolane.inputs import one_line

ELLIPSIS = "…"
SPARKS = "▁▂▃▄▅▆▇█"
_EARLY_WORDS = {
    "settled": "decided early: the remaining cases cannot change it",
    "sequential": "decided early: the sequential test is already sure",
    "coverage": "stopped early: too few comparable cases left",
}
_SPENT_NAMES = {"tokens": " tokens", "cost_usd": "", "wall_seconds": " command time"}
_EARLY_PREFIX = re.compile(  # runs before 2026-12-05 said "early stop: early stop after"
    r"^(early stop: )?(early stop after \d+ of \d+ cases, (settled: )?)?"
)
_CLOSE = 1e-12  # as the gate's tie tolerance: a delta equal to its bar is not above it
_RESULT = (": accepted", ": rejected", ": indecisive")


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, on one line (its line breaks folded: found by
    review, an optimizer's stderr ``oops\\nfinished: finished ...`` printed a line of its own
    that read as the run's end): whole trailing words dropped for ``…`` (a single word too
    long for the width is cut). Its control and bidi characters are shown as U+FFFD
    (`messages.printable`), whoever made it: the view's one place for a command's words."""
    text = messages.printable(one_line(text))
    if cell_len(text) <= width:
        return text
    words = text.split(" ")
    if "/" in words[-1] or words[-1].startswith("sha256:"):  # a path or digest: its middle
        head = " ".join(words[:-1])
        room = width - cell_len(head) - (1 if head else 0)
        if room >= 12:
            return (head + " " if head else "") + middle(words[-1], room)
    while len(words) > 1:
        words.pop()
        kept = " ".join(words).rstrip(" ,;:·") + " " + ELLIPSIS
        if cell_len(kept) <= width:
            return kept
    return cut_end(text, width)


def cut_end(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells with a trailing ``…``."""
    while text and cell_len(text) > max(0, width - 1):
        text = text[:-1]
    return text + ELLIPSIS if width > 0 else ""


def middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, its middle replaced by ``…`` (digests, paths)."""
    if len(text) <= width:
        return text
    if width < 3:
        return text[:width]
    head = (width - 1) * 2 // 3
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def short_digest(digest: str) -> str:
    """A digest in 20 cells: ``sha256:ab12ab12…ef56`` (its start and end)."""
    algorithm, _, hexes = digest.rpartition(":")
    if len(hexes) <= 13:
        return digest
    prefix = f"{algorithm}:" if algorithm else ""
    return f"{prefix}{hexes[:8]}{ELLIPSIS}{hexes[-4:]}"


def pack(segments: list[str], width: int, indent: int = 4, gap: str = "  ") -> list[str]:
    """``segments`` joined by ``gap`` on lines of at most ``width`` cells; a segment that
    does not fit goes to a new line indented by ``indent``, and one too wide for a whole
    line is `fit` (by words)."""
    lines: list[str] = []
    line = ""
    for segment in (messages.printable(one_line(s)) for s in segments if s):
        if line and cell_len(line + gap + segment) <= width:
            line += gap + segment
            continue
        if line:
            lines.append(line)
        lead = " " * indent if lines else ""
        line = lead + fit(segment, max(1, width - cell_len(lead)))
    if line:
        lines.append(line)
    return lines


def sparkline(values: list[float]) -> str:
    """One block per value, from ``▁`` (the lowest) to ``█`` (the highest)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - low) / span * top) if span > 0 else 0] for v in values)


def score_segments(baseline: float | None, best: float | None, series: list[float]) -> list[str]:
    """``val score: baseline 0.610`` ``best so far 0.720 (+0.110)`` and the sparkline."""
    if baseline is None and best is None:
        return []
    parts = [f"val score: baseline {_score(baseline)}"]
    if best is not None:
        gain = f" ({best - baseline:+.3f})" if baseline is not None else ""
        parts.append(f"best so far {best:.3f}{gain}")
    if len(series) > 1:
        parts.append(sparkline(series[-40:]))
    return parts


def _score(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def rule_text(event: messages.DecisionEvent) -> str:
    """The rule that decided, with its numbers, in words: ``delta +0.0625 <= 1.0 x SE
    0.0625`` for a paired reject; the gate's own reason for the others."""
    reason = event.reason
    if event.early == "coverage" or reason.startswith("coverage"):
        return f"only {event.n} of {event.n_planned} cases comparable: no decision"
    mean, se, k = event.mean_delta, event.se, event.k_se
    if reason.startswith("regression"):
        return _trimmed(reason.replace("regression: ", "vetoed: "))
    if event.gate != "paired" or mean is None or se is None or k is None:
        return _trimmed(_EARLY_PREFIX.sub("", reason))
    floor, bar = event.min_effect or 0.0, k * se
    above = mean > bar + _CLOSE and mean > floor + _CLOSE
    if event.decision == "indecisive" or (event.decision == "accept") != above:
        return _trimmed(_EARLY_PREFIX.sub("", reason))  # another rule decided (online control)
    if se == 0.0:
        relation = ">" if above else "<="
        return f"delta {mean:+.4f} on every case {relation} {max(0.0, floor):g}"
    if above:
        floor_too = f" and > min effect {floor:g}" if floor > 0 else ""
        return f"delta {mean:+.4f} > {k:.1f} x SE {se:.4f}{floor_too}"
    if mean > bar + _CLOSE:
        return f"delta {mean:+.4f} <= min effect {floor:g}"
    return f"delta {mean:+.4f} <= {k:.1f} x SE {se:.4f}"


def _trimmed(reason: str) -> str:
    for ending in _RESULT:
        reason = reason.removesuffix(ending)
    return reason


def reason_words(reason: str) -> str:
    """A slot's reason in words (an early stop said as what it means)."""
    if not reason.startswith("early stop"):
        return reason
    for source in ("settled", "coverage"):
        if f", {source}:" in reason:
            return _EARLY_WORDS[source]
    return _EARLY_WORDS["sequential"]


def decision_segments(event: messages.DecisionEvent, label: str) -> list[str]:
    """A decision as segments: who and what, the rule, the cases moved, how it stopped,
    the candidate's val score (an accept) and the optimizer's summary of the edit."""
    parts = [f"{label} {event.decision}", rule_text(event)]
    if event.fixed is not None and event.broken is not None:
        parts.append(f"fixed {event.fixed}, broken {event.broken}")
    if event.early and event.early != "coverage":
        parts.append(_EARLY_WORDS[event.early])
    if event.decision == "accept" and event.candidate_mean is not None:
        parts.append(f"val score {event.candidate_mean:.3f}")
    if event.summary:  # labelled once, also when the optimizer's own words begin "edit:"
        said = event.summary.lower().startswith("edit:")
        parts.append(event.summary if said else f"edit: {event.summary}")
    elif event.digest:
        parts.append(short_digest(event.digest))
    return parts


def spent_text(spent: messages.Usage, dimensions: tuple[messages.Dimension, ...]) -> str:
    """``12.3k tokens · $0.41 · 1m02s command time`` of the dimensions known."""
    parts = []
    for dimension in dimensions:
        value = spent.get(dimension)
        if value is not None:
            parts.append(amount(dimension, value) + _SPENT_NAMES[dimension])
    return " · ".join(parts)
