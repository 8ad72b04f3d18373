"""Charts as inline SVG, drawn here on the server: no JavaScript library, nothing fetched.

Readable without colour: every series has its own fill pattern (solid, stripes, dots, ...)
as well as its colour, the legend shows the pattern beside the name, reference lines carry
their name in words, and every bar has a ``<title>`` (a tooltip, and what a screen reader
reads) with its numbers. The pages put the same numbers in a table beside each chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from django.utils.safestring import SafeString, mark_safe

# (colour, pattern drawn over a pale tint of it); index 0 is solid.
_PATTERNS: tuple[tuple[str, str], ...] = (
    ("#2f6fdf", ""),
    ("#d9731a", '<path d="M-1,1 l2,-2 M0,8 l8,-8 M7,9 l2,-2" stroke-width="2.2"/>'),
    ("#23915a", '<circle cx="2" cy="2" r="1.5"/><circle cx="6" cy="6" r="1.5"/>'),
    ("#8e44ad", '<path d="M0,0 l8,8 M8,0 l-8,8" stroke-width="1.4"/>'),
    ("#c0392b", '<path d="M0,2 h8 M0,6 h8" stroke-width="1.6"/>'),
    ("#13808f", '<path d="M2,0 v8 M6,0 v8" stroke-width="1.6"/>'),
    ("#6b7280", '<path d="M-1,7 l2,2 M0,0 l8,8 M7,-1 l2,2" stroke-width="2.2"/>'),
    ("#a37a00", '<rect x="0" y="0" width="4" height="4"/><rect x="4" y="4" width="4" height="4"/>'),
)
# Most series a stacked chart draws; the smallest of the rest are added up into one.
MAX_SERIES = len(_PATTERNS)

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 46, 12, 18, 42
FONT = 'font-family="system-ui, sans-serif"'


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    values: Sequence[float]


@dataclass(frozen=True, slots=True)
class LegendItem:
    name: str
    swatch: SafeString  # a small inline SVG in the series' pattern


def number(value: float) -> str:
    """A chart label: ``12``, ``4.5``, ``0.06`` (at most two decimals, no trailing zeros)."""
    return f"{round(value, 2):g}"


def axis(value: float, *, ticks: int = 5) -> tuple[float, float]:
    """The top of an axis for values up to ``value`` and the step of its gridlines: a step of
    1, 2, 2.5 or 5 times a power of ten, about ``ticks`` of them, the top a whole number of
    steps (so the labels read 0, 5, 10, 15 rather than 0, 3.75, 7.5)."""
    if value <= 0:
        return 1.0, 0.25
    rough = value / ticks
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= rough * (1 - 1e-9))
    return step * math.ceil(value / step - 1e-9), step


def top_series(series: Sequence[Series], *, others: str) -> list[Series]:
    """``series`` with at most ``MAX_SERIES`` kept: the largest by total, the rest added up
    into one series named ``others`` (a team with twenty members still gets a readable chart;
    the table beside it lists everyone)."""
    if len(series) <= MAX_SERIES:
        return list(series)
    ranked = sorted(series, key=lambda s: -sum(s.values))
    kept, rest = ranked[: MAX_SERIES - 1], ranked[MAX_SERIES - 1 :]
    length = len(series[0].values)
    summed = [sum(s.values[i] for s in rest) for i in range(length)]
    kept_names = {s.name for s in kept}
    return [s for s in series if s.name in kept_names] + [Series(others, summed)]


def _pattern_defs(chart_id: str, count: int) -> str:
    defs = []
    for index in range(count):
        colour, drawing = _PATTERNS[index % len(_PATTERNS)]
        if not drawing:
            continue
        defs.append(
            f'<pattern id="{chart_id}-p{index}" patternUnits="userSpaceOnUse" width="8" '
            f'height="8"><rect width="8" height="8" fill="{colour}" fill-opacity="0.22"/>'
            f'<g fill="{colour}" stroke="{colour}">{drawing}</g></pattern>'
        )
    return "".join(defs)


def _fill(chart_id: str, index: int) -> str:
    colour, drawing = _PATTERNS[index % len(_PATTERNS)]
    return colour if not drawing else f"url(#{chart_id}-p{index})"


def _colour(index: int) -> str:
    return _PATTERNS[index % len(_PATTERNS)][0]


def swatch(chart_id: str, index: int) -> SafeString:
    """The legend's sample of series ``index``: the same pattern, its own small SVG (the
    pattern is the chart's, referenced by id, so the legend can wrap as HTML text)."""
    return mark_safe(
        f'<svg class="swatch" width="16" height="16" viewBox="0 0 16 16" aria-hidden="true">'
        f'<rect x="0.5" y="0.5" width="15" height="15" fill="{_fill(chart_id, index)}" '
        f'stroke="{_colour(index)}"/></svg>'
    )


def _y_axis(top: float, step: float, plot_h: float, unit: str) -> str:
    parts = []
    for n in range(round(top / step) + 1):
        value = n * step
        y = TOP + plot_h - plot_h * value / top
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#e1e5eb"/><text x="{LEFT - 6}" y="{y + 3.5:.1f}" text-anchor="end" '
            f'font-size="11" fill="#647084" {FONT}>{number(value)}</text>'
        )
    parts.append(
        f'<text x="12" y="{TOP + plot_h / 2:.1f}" font-size="11" fill="#647084" '
        f'text-anchor="middle" transform="rotate(-90 12 {TOP + plot_h / 2:.1f})" {FONT}>'
        f"{escape(unit)}</text>"
    )
    return "".join(parts)


def _open(chart_id: str, title: str, description: str) -> str:
    return (
        f'<svg id="{chart_id}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc" xmlns="http://www.w3.org/2000/svg">'
        f'<title id="{chart_id}-title">{escape(title)}</title>'
        f'<desc id="{chart_id}-desc">{escape(description)}</desc>'
    )


def _close(base_y: float) -> str:
    """The x axis's line, and the end of the chart."""
    return (
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base_y}" y2="{base_y}" stroke="#9aa4b2"/>'
        "</svg>"
    )


def stacked_bars(
    *,
    chart_id: str,
    title: str,
    description: str,
    labels: Sequence[str],
    bar_titles: Sequence[str],
    series: Sequence[Series],
    unit: str,
) -> tuple[SafeString, list[LegendItem]]:
    """Bars stacked by series, one per label (a day), each with its total written above it
    when there is room; returns the SVG and its legend."""
    count = len(labels)
    totals = [sum(s.values[i] for s in series) for i in range(count)]
    top, step = axis(max(totals, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    band = plot_w / max(count, 1)
    bar_w = band * 0.72
    parts = [
        _open(chart_id, title, description),
        f"<defs>{_pattern_defs(chart_id, len(series))}</defs>",
    ]
    parts.append(_y_axis(top, step, plot_h, unit))
    base_y = TOP + plot_h
    for i in range(count):
        x = LEFT + band * i + (band - bar_w) / 2
        breakdown = ", ".join(f"{s.name} {number(s.values[i])}" for s in series if s.values[i])
        bar_title = f"{bar_titles[i]}: {number(totals[i])} {unit}"
        if breakdown and len(series) > 1:
            bar_title += f" ({breakdown})"
        parts.append(f'<g class="bar"><title>{escape(bar_title)}</title>')
        y = base_y
        for index, s in enumerate(series):
            height = plot_h * s.values[i] / top
            if height <= 0:
                continue
            y -= height
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{height:.1f}" '
                f'fill="{_fill(chart_id, index)}" stroke="{_colour(index)}" stroke-width="0.8">'
                f"<title>{escape(f'{s.name}, {bar_titles[i]}: {number(s.values[i])} {unit}')}"
                "</title></rect>"
            )
        if totals[i] > 0 and band >= 20:
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                f'font-size="10" fill="#1d2330" {FONT}>{number(totals[i])}</text>'
            )
        parts.append("</g>")
        label_step = 1 if band >= 18 else math.ceil(18 / band)
        if i % label_step == 0 or i == count - 1:
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{base_y + 15}" text-anchor="middle" '
                f'font-size="11" fill="#647084" {FONT}>{escape(labels[i])}</text>'
            )
    parts.append(_close(base_y))
    legend = [LegendItem(s.name, swatch(chart_id, index)) for index, s in enumerate(series)]
    return mark_safe("".join(parts)), legend


@dataclass(frozen=True, slots=True)
class Level:
    """A level held over one bin (an hour), for ``held_against_guarantee``."""

    label: str  # for the bar's title: "Fri 10 May 13:00 UTC"
    mean: float
    peak: float
    day_mark: str = ""  # set on the first bin of a day: the axis writes it there


def held_against_guarantee(
    *,
    chart_id: str,
    title: str,
    description: str,
    levels: Sequence[Level],
    guarantee: float,
    limit: float | None,
    unit: str = "GPU units",
) -> tuple[SafeString, list[LegendItem]]:
    """One thin bar per bin: the part within the guarantee solid, the part above it (what
    the team borrows) striped; the guarantee and the limit as labelled lines."""
    count = len(levels)
    peak = max((level.mean for level in levels), default=0.0)
    top, step = axis(max(peak, guarantee, limit or 0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    band = plot_w / max(count, 1)
    base_y = TOP + plot_h
    within, borrowed = 0, 1  # pattern indexes: solid, stripes
    parts = [_open(chart_id, title, description), f"<defs>{_pattern_defs(chart_id, 2)}</defs>"]
    parts.append(_y_axis(top, step, plot_h, unit))
    for i, level in enumerate(levels):
        x = LEFT + band * i
        over = max(0.0, level.mean - guarantee)
        text = (
            f"{level.label}: {number(level.mean)} {unit} held on average "
            f"(peak {number(level.peak)})"
        )
        text += f", {number(over)} above the guarantee" if over > 0 else ", within the guarantee"
        parts.append(f'<g class="bar"><title>{escape(text)}</title>')
        low = min(level.mean, guarantee)
        low_h = plot_h * low / top
        if low_h > 0:
            parts.append(
                f'<rect x="{x:.2f}" y="{base_y - low_h:.1f}" width="{band:.2f}" '
                f'height="{low_h:.1f}" fill="{_fill(chart_id, within)}"/>'
            )
        if over > 0:
            over_h = plot_h * over / top
            parts.append(
                f'<rect x="{x:.2f}" y="{base_y - low_h - over_h:.1f}" width="{band:.2f}" '
                f'height="{over_h:.1f}" fill="{_fill(chart_id, borrowed)}" '
                f'stroke="{_colour(borrowed)}" stroke-width="0.5"/>'
            )
        parts.append("</g>")
        if level.day_mark:
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{base_y + 4}" stroke="#c5ccd6"/>'
                f'<text x="{x + 3:.1f}" y="{base_y + 15}" font-size="11" fill="#647084" '
                f"{FONT}>{escape(level.day_mark)}</text>"
            )
    for name, value, dash in (("guarantee", guarantee, "6 4"), ("limit", limit, "2 3")):
        if value is None:
            continue
        y = base_y - plot_h * value / top
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#1d2330" '
            f'stroke-width="1.4" stroke-dasharray="{dash}"/>'
            f'<text x="{WIDTH - RIGHT - 4}" y="{y - 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="#1d2330" paint-order="stroke" stroke="#fff" stroke-width="3" {FONT}>'
            f"{name} {number(value)}</text>"
        )
    parts.append(_close(base_y))
    legend = [
        LegendItem("held within the guarantee", swatch(chart_id, within)),
        LegendItem("borrowed: held above the guarantee (preemptible)", swatch(chart_id, borrowed)),
    ]
    return mark_safe("".join(parts)), legend


# Line styles of ``lines``: each series its own dash pattern and marker as well as colour.
_DASHES: tuple[str, ...] = ("", "7 4", "2 3", "10 3 2 3")
_MARKERS: tuple[str, ...] = ("circle", "square", "diamond", "triangle")


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a line chart; None is a gap (nothing known then)."""

    name: str
    values: Sequence[float | None]


def _marker(kind: str, x: float, y: float, colour: str) -> str:
    if kind == "square":
        return (
            f'<rect x="{x - 2.6:.1f}" y="{y - 2.6:.1f}" width="5.2" height="5.2" fill="{colour}"/>'
        )
    if kind == "diamond":
        return (
            f'<path d="M{x:.1f},{y - 3.4:.1f} L{x + 3.4:.1f},{y:.1f} L{x:.1f},{y + 3.4:.1f} '
            f'L{x - 3.4:.1f},{y:.1f} Z" fill="{colour}"/>'
        )
    if kind == "triangle":
        return (
            f'<path d="M{x:.1f},{y - 3.4:.1f} L{x + 3.2:.1f},{y + 2.6:.1f} '
            f'L{x - 3.2:.1f},{y + 2.6:.1f} Z" fill="{colour}"/>'
        )
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.8" fill="{colour}"/>'


def line_swatch(index: int) -> SafeString:
    """The legend's sample of line ``index``: its dash pattern and marker."""
    colour = _colour(index)
    dash = _DASHES[index % len(_DASHES)]
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return mark_safe(
        f'<svg class="swatch" width="28" height="16" viewBox="0 0 28 16" aria-hidden="true">'
        f'<line x1="1" x2="27" y1="8" y2="8" stroke="{colour}" stroke-width="2"{dashed}/>'
        f"{_marker(_MARKERS[index % len(_MARKERS)], 14, 8, colour)}</svg>"
    )


def lines(
    *,
    chart_id: str,
    title: str,
    description: str,
    positions: Sequence[float],
    point_titles: Sequence[str],
    ticks: Sequence[tuple[float, str]],
    series: Sequence[Line],
    unit: str,
    top: float | None = None,
) -> tuple[SafeString, list[LegendItem]]:
    """Lines over time: ``positions`` place the points along the x axis (epoch seconds, any
    increasing numbers), ``ticks`` label it, ``point_titles`` name each point in its markers'
    ``<title>``. The y axis runs from 0 to ``top`` (else to the largest value, rounded up).
    A gap (None) breaks a line. Returns the SVG and its legend."""
    peak = max((v for s in series for v in s.values if v is not None), default=0.0)
    top, step = axis(top) if top is not None else axis(peak)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    first = positions[0] if positions else 0.0
    span = (positions[-1] - first) if len(positions) > 1 else 1.0
    base_y = TOP + plot_h

    def x_of(position: float) -> float:
        if len(positions) == 1:
            return LEFT + plot_w / 2
        return LEFT + plot_w * (position - first) / span

    def y_of(value: float) -> float:
        return base_y - plot_h * min(value, top) / top

    parts = [_open(chart_id, title, description), _y_axis(top, step, plot_h, unit)]
    for position, label in ticks:
        x = x_of(position)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base_y}" y2="{base_y + 4}" stroke="#9aa4b2"/>'
            f'<text x="{x:.1f}" y="{base_y + 16}" text-anchor="middle" font-size="11" '
            f'fill="#647084" {FONT}>{escape(label)}</text>'
        )
    for index, line in enumerate(series):
        colour = _colour(index)
        dash = _DASHES[index % len(_DASHES)]
        path: list[str] = []
        pen_down = False
        for position, value in zip(positions, line.values, strict=True):
            if value is None:
                pen_down = False
                continue
            path.append(f"{'L' if pen_down else 'M'}{x_of(position):.1f},{y_of(value):.1f}")
            pen_down = True
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<g class="line" data-series="{escape(line.name)}">')
        if path:
            parts.append(
                f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="2"'
                f"{dashed}/>"
            )
        kind = _MARKERS[index % len(_MARKERS)]
        for position, value, name in zip(positions, line.values, point_titles, strict=True):
            if value is None:
                continue
            text = f"{name}: {line.name} {number(value)} {unit}"
            parts.append(
                f"<g><title>{escape(text)}</title>"
                f"{_marker(kind, x_of(position), y_of(value), colour)}</g>"
            )
        parts.append("</g>")
    parts.append(_close(base_y))
    legend = [LegendItem(line.name, line_swatch(index)) for index, line in enumerate(series)]
    return mark_safe("".join(parts)), legend
