"""A hit-ratio curve drawn to a file: a self-contained HTML page or a PNG.

HTML is inline SVG written by hand, so it needs no dependency and opens
anywhere, offline. PNG needs matplotlib, the optional ``plot`` extra; the
format and the folder are checked before any replay runs, so a missing extra,
a bad suffix or a folder that takes no file costs the user nothing.
"""

from __future__ import annotations

import math
import secrets
import shutil
from html import escape
from pathlib import Path

from offload.insight.curve import HitRatioCurve
from offload.shown import shown

FORMATS = (".html", ".png")
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")
_WIDTH, _HEIGHT, _MARGIN = 720, 440, 60
# The legend's own column right of the plot: inside it, the best policy's line at the
# largest capacity (the top right corner) ran through the names.
_LEGEND_WIDTH = 120


class PlotError(ValueError):
    """A plot that cannot be written; the message names the file and the fix."""


def check_plot_path(path: str | Path) -> Path:
    """The path, if its suffix is a format this can write (and PNG's extra is installed) and
    a plot can be written there: its folder is there and takes a file, and it is no folder."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise PlotError(
            f"cannot plot to {shown(path)}: unsupported file type {shown(suffix or '(none)')!r}; "
            f"use {' or '.join(FORMATS)}"
        )
    if suffix == ".png":
        _pyplot()
    if not path.parent.is_dir():
        raise PlotError(f"cannot plot to {shown(path)}: no directory {shown(path.parent)}")
    if path.is_dir():  # found here, not after a replay of minutes as the plot is written
        raise PlotError(f"cannot plot to {shown(path)}: it is a directory")
    target = _target(path)
    # A directory this process cannot write in (a read-only mount, another user's, /proc)
    # is found by writing there, as the plot will be: permission bits alone do not tell
    # (root passes them, a read-only mount fails whatever they say).
    probe = _partial(target, ".probe")
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise PlotError(f"cannot plot to {shown(path)}: {exc.strerror or exc}") from None
    return path


def _target(path: Path) -> Path:
    """The file a plot at ``path`` replaces: through a link, the link's file."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links (RuntimeError before 3.13)
        raise PlotError(f"cannot write plot {shown(path)}: {shown(exc)}") from None


def _partial(target: Path, suffix: str) -> Path:
    """A name of its own beside ``target``, hidden, for a file made before it is renamed."""
    return target.with_name(f".{target.name}.{secrets.token_hex(6)}.partial{suffix}")


def write_plot(curve: HitRatioCurve, path: str | Path, title: str) -> Path:
    """Draw every policy's hit ratio against capacity (log scale) into ``path``."""
    path = check_plot_path(path)
    # Drawn beside its target (through a link, the link's file), under a name of its own,
    # then renamed over it: a failure part way leaves the old file whole, and two writers
    # never share a half-written one. The new file keeps the old one's mode. Its format is
    # the one asked for (the path's suffix), whatever a link points at.
    target = _target(path)
    partial = _partial(target, path.suffix)
    try:
        if path.suffix.lower() == ".png":
            _write_png(curve, partial, title)
        else:
            partial.write_text(_html(curve, title), encoding="utf-8")
        if target.exists():
            shutil.copymode(target, partial)
        partial.replace(target)
    except OSError as exc:
        raise PlotError(f"cannot write plot {shown(path)}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        raise PlotError(
            "a .png plot needs matplotlib: pip install 'kvscope[plot]' "
            "(or plot to a .html file, which needs nothing)"
        ) from None
    return pyplot


def _write_png(curve: HitRatioCurve, path: Path, title: str) -> None:
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(8, 5))
    try:
        for policy, ratios in curve.hit_ratios.items():
            axes.plot(curve.capacities, [100 * r for r in ratios], marker="o", label=policy)
        if curve.current is not None:
            axes.axvline(curve.current, linestyle="--", color="grey", label="current")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("capacity (blocks)")
        axes.set_ylabel("hit ratio (%)")
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend()
        figure.savefig(path, dpi=100)
    finally:
        pyplot.close(figure)


def _html(curve: HitRatioCurve, title: str) -> str:
    """A page holding one SVG: axes, a polyline and points per policy, a legend."""
    low, high = math.log2(curve.capacities[0]), math.log2(curve.capacities[-1])
    top = max(max(r, default=0.0) for r in curve.hit_ratios.values()) if curve.hit_ratios else 0
    top = max(0.01, math.ceil(top * 20) / 20)  # the y axis ends on the next 5%
    inner_w, inner_h = _WIDTH - 2 * _MARGIN, _HEIGHT - 2 * _MARGIN

    def x(capacity: float) -> float:
        share = (math.log2(capacity) - low) / (high - low) if high > low else 0.5
        return _MARGIN + share * inner_w

    def y(ratio: float) -> float:
        return _HEIGHT - _MARGIN - ratio / top * inner_h

    parts = [
        f'<line x1="{_MARGIN}" y1="{_HEIGHT - _MARGIN}" x2="{_WIDTH - _MARGIN}" '
        f'y2="{_HEIGHT - _MARGIN}" stroke="#444"/>',
        f'<line x1="{_MARGIN}" y1="{_MARGIN}" x2="{_MARGIN}" y2="{_HEIGHT - _MARGIN}" '
        f'stroke="#444"/>',
    ]
    for step in range(5):
        ratio = top * step / 4
        parts.append(
            f'<text x="{_MARGIN - 8}" y="{y(ratio) + 4:.1f}" text-anchor="end">'
            f"{100 * ratio:.1f}%</text>"
        )
    for capacity in curve.capacities:
        parts.append(
            f'<text x="{x(capacity):.1f}" y="{_HEIGHT - _MARGIN + 18}" '
            f'text-anchor="middle">{capacity:,}</text>'
        )
    if curve.current is not None:
        cx = x(curve.current)
        parts.append(
            f'<line x1="{cx:.1f}" y1="{_MARGIN}" x2="{cx:.1f}" y2="{_HEIGHT - _MARGIN}" '
            f'stroke="#888" stroke-dasharray="5,4"><title>current capacity</title></line>'
        )
    for index, (policy, ratios) in enumerate(curve.hit_ratios.items()):
        colour = COLOURS[index % len(COLOURS)]
        points = " ".join(
            f"{x(c):.1f},{y(r):.1f}" for c, r in zip(curve.capacities, ratios, strict=True)
        )
        name = escape(policy)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'
        )
        for capacity, ratio in zip(curve.capacities, ratios, strict=True):
            parts.append(
                f'<circle cx="{x(capacity):.1f}" cy="{y(ratio):.1f}" r="3.5" fill="{colour}">'
                f"<title>{name} at {capacity:,} blocks: {100 * ratio:.2f}%</title></circle>"
            )
        ly = _MARGIN + 18 * index
        parts.append(
            f'<rect x="{_WIDTH - _MARGIN + 24}" y="{ly - 9}" width="12" height="12" '
            f'fill="{colour}"/><text x="{_WIDTH - _MARGIN + 42}" y="{ly + 2}">{name}</text>'
        )
    svg = "\n".join(parts)
    heading = escape(title)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{heading}</title>
<style>body{{font-family:sans-serif;margin:2em}} svg text{{font-size:12px}}</style></head>
<body><h1 style="font-size:16px">{heading}</h1>
<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH + _LEGEND_WIDTH}" height="{_HEIGHT}"
 role="img" aria-label="hit ratio by capacity">
<text x="{_WIDTH / 2}" y="{_HEIGHT - 15}" text-anchor="middle">capacity (blocks, log scale)</text>
<text x="15" y="{_HEIGHT / 2}" transform="rotate(-90 15 {_HEIGHT / 2})"
 text-anchor="middle">hit ratio</text>
{svg}
</svg></body></html>
"""
