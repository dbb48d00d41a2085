"""A small static-SVG writer for the HTML report: a plot area with linear scales and axes.

Everything drawn is a string of SVG elements with CSS classes (the page's own stylesheet
colours them) and ``<title>`` children for hover text, so a page needs no script and no
font or file from anywhere. Every text is scrubbed and escaped here (`scrub`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evolane.views._scrub import scrub

Point = tuple[float, float]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 times a power of ten) that
    cover ``low..high``."""
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low] if math.isfinite(low) else [0.0]
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks: list[float] = []
    value = first
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        value += step
    return ticks


def span(values: Sequence[float], pad: float = 0.05, floor: float | None = None) -> Point:
    """A (low, high) range holding ``values`` with a margin (never empty)."""
    finite = [v for v in values if math.isfinite(v)]
    if floor is not None:
        finite.append(floor)
    if not finite:
        return (0.0, 1.0)
    low, high = min(finite), max(finite)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    margin = (high - low) * pad
    return (low - margin if floor is None or low < floor else low, high + margin)


def fmt_number(value: float) -> str:
    """A short tick label."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.1e}"
    if abs(value) >= 1000:
        return f"{value / 1000:.4g}k"
    return f"{value:.3g}"


@dataclass
class Plot:
    """A chart: data ranges mapped onto a ``width`` x ``height`` box inside margins."""

    width: int
    height: int
    x_range: Point
    y_range: Point
    left: int = 56
    right: int = 16
    top: int = 14
    bottom: int = 38
    parts: list[str] = field(default_factory=list)

    def x(self, value: float) -> float:
        """The pixel column of a data x."""
        low, high = self.x_range
        inner = self.width - self.left - self.right
        return self.left + (value - low) / ((high - low) or 1.0) * inner

    def y(self, value: float) -> float:
        """The pixel row of a data y."""
        low, high = self.y_range
        inner = self.height - self.top - self.bottom
        return self.top + (1 - (value - low) / ((high - low) or 1.0)) * inner

    def line(self, points: Sequence[Point], cls: str, step: bool = False) -> None:
        """A polyline through data points (``step``: hold each value until the next x)."""
        if not points:
            return
        drawn: list[Point] = []
        for index, (px, py) in enumerate(points):
            if step and index:
                drawn.append((px, points[index - 1][1]))
            drawn.append((px, py))
        path = " ".join(f"{self.x(px):.1f},{self.y(py):.1f}" for px, py in drawn)
        self.parts.append(f'<polyline class="{cls}" points="{path}"/>')

    def band(self, low: Sequence[Point], high: Sequence[Point], cls: str) -> None:
        """A filled band between two lines of the same xs (a confidence band)."""
        if not low:
            return
        ring = [*low, *reversed(high)]
        path = " ".join(f"{self.x(px):.1f},{self.y(py):.1f}" for px, py in ring)
        self.parts.append(f'<polygon class="{cls}" points="{path}"/>')

    def hline(self, value: float, cls: str, label: str = "") -> None:
        """A horizontal rule across the plot at data y ``value``, labelled at its right."""
        y = self.y(value)
        self.parts.append(_segment(cls, self.left, self.width - self.right, y, y))
        if label:
            self.text(self.width - self.right - 2, y - 3, label, "label end")

    def bar(self, x: float, low: float, high: float, cls: str, tip: str = "") -> None:
        """A vertical interval at data x from ``low`` to ``high`` (an error bar)."""
        px, y0, y1 = self.x(x), self.y(low), self.y(high)
        self.parts.append(
            f'<line class="{cls}" x1="{px:.1f}" x2="{px:.1f}" y1="{y0:.1f}" y2="{y1:.1f}">'
            f"{_title(tip)}</line>"
        )

    def rect(self, x: Point, y: Point, cls: str, tip: str = "") -> None:
        """A box over data x ``x[0]..x[1]`` and y ``y[0]..y[1]``, with hover text."""
        left, right = sorted((self.x(x[0]), self.x(x[1])))
        top, bottom = sorted((self.y(y[0]), self.y(y[1])))
        self.parts.append(
            f'<rect class="{cls}" x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" '
            f'height="{max(bottom - top, 0.5):.1f}">{_title(tip)}</rect>'
        )

    def dot(self, x: float, y: float, cls: str, tip: str = "", r: float = 4.0) -> None:
        """A marker at a data point, with hover text."""
        self.parts.append(
            f'<circle class="{cls}" cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="{r}">'
            f"{_title(tip)}</circle>"
        )

    def text(self, px: float, py: float, words: str, cls: str = "label") -> None:
        """Text at a pixel position (escaped)."""
        anchor = ' text-anchor="end"' if "end" in cls.split() else ""
        anchor = ' text-anchor="middle"' if "mid" in cls.split() else anchor
        self.parts.append(
            f'<text class="{cls}" x="{px:.1f}" y="{py:.1f}"{anchor}>{scrub(words)}</text>'
        )

    def axes(
        self, x_label: str, y_label: str, x_format: Callable[[float], str] = fmt_number
    ) -> None:
        """Both axes with round ticks and their labels."""
        base, right = self.height - self.bottom, self.width - self.right
        self.parts.append(_segment("axis", self.left, right, base, base))
        self.parts.append(_segment("axis", self.left, self.left, self.top, base))
        for tick in nice_ticks(*self.x_range):
            self.text(self.x(tick), base + 14, x_format(tick), "tick mid")
        for tick in nice_ticks(*self.y_range):
            y = self.y(tick)
            self.parts.append(_segment("grid", self.left, right, y, y))
            self.text(self.left - 5, y + 4, fmt_number(tick), "tick end")
        self.text((self.left + right) / 2, self.height - 6, x_label, "axis-label mid")
        self.parts.append(
            f'<text class="axis-label" transform="translate(12,{(self.top + base) / 2:.0f}) '
            f'rotate(-90)" text-anchor="middle">{scrub(y_label)}</text>'
        )

    def svg(self, label: str) -> str:
        """The finished ``<svg>`` element (``label``: its accessible name)."""
        return (
            f'<svg viewBox="0 0 {self.width} {self.height}" '
            f'width="{self.width}" height="{self.height}" role="img" '
            f'aria-label="{scrub(label)}">{"".join(self.parts)}</svg>'
        )


def _title(tip: str) -> str:
    return f"<title>{scrub(tip)}</title>" if tip else ""


def _segment(cls: str, x1: float, x2: float, y1: float, y2: float) -> str:
    return f'<line class="{cls}" x1="{x1:.1f}" x2="{x2:.1f}" y1="{y1:.1f}" y2="{y2:.1f}"/>'
