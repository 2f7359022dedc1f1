"""The curve type and its drawings."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from offload.insight.curve import HitRatioCurve, scaled_capacities
from offload.insight.plot import PlotError, check_plot_path, write_plot


def test_scaled_capacities_cover_an_eighth_to_eight_times() -> None:
    assert scaled_capacities(2000) == (250, 500, 1000, 2000, 4000, 8000, 16000)
    assert scaled_capacities(3) == (1, 2, 3, 6, 12, 24)  # whole blocks, no repeats


@pytest.mark.parametrize("current", [0, -5, 2.5, True])
def test_a_bad_current_capacity_is_refused(current: object) -> None:
    with pytest.raises(ValueError, match="current capacity must be a whole number"):
        scaled_capacities(current)  # type: ignore[arg-type]


def test_a_curve_knows_its_multiples_and_refuses_a_mismatch() -> None:
    curve = HitRatioCurve((500, 1000, 2000), {"lru": (0.1, 0.2, 0.3)}, current=1000)
    assert curve.multiples() == (0.5, 1.0, 2.0)
    assert curve.at("lru", 2000) == 0.3
    assert curve.as_dict()["multiples"] == [0.5, 1.0, 2.0]
    with pytest.raises(ValueError, match="lru: 2 hit ratios for 3 capacities"):
        HitRatioCurve((1, 2, 3), {"lru": (0.1, 0.2)})
    with pytest.raises(ValueError, match="current capacity 7 is not one of"):
        HitRatioCurve((1, 2), {"lru": (0.1, 0.2)}, current=7)
    with pytest.raises(ValueError, match="ascending and distinct"):
        HitRatioCurve((2, 1), {})


def test_an_html_plot_is_one_self_contained_svg_per_curve(tmp_path: Path) -> None:
    curve = HitRatioCurve(
        (250, 500, 1000), {"lru": (0.04, 0.05, 0.09), "<arc>": (0.05, 0.07, 0.1)}, current=500
    )
    page = write_plot(curve, tmp_path / "curve.html", "bundled & more").read_text()
    assert page.count("<svg") == 1 and page.count("<polyline") == 2
    assert page.count("<circle") == 6
    assert "current capacity" in page
    assert "&lt;arc&gt;" in page and "<arc>" not in page  # names are escaped
    assert "bundled &amp; more" in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def test_an_html_plots_legend_stands_beside_the_lines_not_over_them(tmp_path: Path) -> None:
    """The legend sat inside the plot's top right corner, where the best policy's line at
    the largest capacity runs (``kvscope replay --policy lru,arc,opt`` drew opt's line
    through the names): every legend swatch and name now starts right of the x axis's end."""
    curve = HitRatioCurve(
        (500, 1000, 2000), {"lru": (0.4, 0.5, 0.55), "opt": (0.57, 0.63, 0.67)}, current=1000
    )
    page = write_plot(curve, tmp_path / "curve.html", "t").read_text()
    axis_ends = re.findall(r'<line x1="[\d.]+" y1="[\d.]+" x2="([\d.]+)"', page)
    axis_end = max(float(x) for x in axis_ends)
    drawn = [float(x) for x in re.findall(r'<circle cx="([\d.]+)"', page)]
    assert drawn and max(drawn) <= axis_end
    swatches = [float(x) for x in re.findall(r'<rect x="([\d.]+)"', page)]
    names = re.findall(r'<text x="([\d.]+)" y="[\d.]+">(lru|opt)</text>', page)
    assert len(swatches) == 2 and len(names) == 2
    assert min(swatches) > axis_end and min(float(x) for x, _ in names) > axis_end
    width = float(re.search(r'<svg[^>]* width="([\d.]+)"', page).group(1))
    assert all(float(x) + 8 * len(name) <= width for x, name in names)  # and inside the image


@pytest.mark.parametrize(
    ("name", "message"),
    [("curve.jpg", "unsupported file type '.jpg'; use .html or .png"),
     ("curve", "unsupported file type '(none)'")],
)  # fmt: skip
def test_an_unsupported_plot_file_is_named(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(PlotError, match=re.escape(message)):
        check_plot_path(tmp_path / name)


def test_a_plot_into_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(PlotError, match="no directory"):
        check_plot_path(tmp_path / "absent" / "curve.html")


def test_a_png_plot_needs_the_plot_extra_or_is_a_png(tmp_path: Path) -> None:
    curve = HitRatioCurve((1, 2), {"lru": (0.1, 0.2)})
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(PlotError, match=r"pip install 'kvscope\[plot\]'"):
            write_plot(curve, tmp_path / "curve.png", "t")
    else:
        written = write_plot(curve, tmp_path / "curve.png", "t")
        assert written.read_bytes().startswith(b"\x89PNG")


def test_a_plot_written_over_another_through_a_link_keeps_the_link_and_the_mode(
    tmp_path: Path,
) -> None:
    curve = HitRatioCurve((100, 200), {"lru": (0.1, 0.2)}, 100, exact=True)
    old = tmp_path / "kept.html"
    old.write_text("the old plot")
    old.chmod(0o640)
    link = tmp_path / "link.html"
    link.symlink_to(old)
    write_plot(curve, link, "t")
    assert link.is_symlink() and "<svg" in old.read_text()
    assert old.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.html", "link.html"]


def test_a_plot_takes_the_format_asked_for_and_a_loop_of_links_is_a_clear_error(
    tmp_path: Path,
) -> None:
    curve = HitRatioCurve((100, 200), {"lru": (0.1, 0.2)}, 100, exact=True)
    (tmp_path / "curve.html").symlink_to(tmp_path / "real.png")
    write_plot(curve, tmp_path / "curve.html", "t")
    assert (tmp_path / "real.png").read_text().startswith("<!DOCTYPE html>")
    (tmp_path / "a.html").symlink_to(tmp_path / "b.html")
    (tmp_path / "b.html").symlink_to(tmp_path / "a.html")
    with pytest.raises(PlotError, match=r"cannot write plot .*a\.html"):
        write_plot(curve, tmp_path / "a.html", "t")
