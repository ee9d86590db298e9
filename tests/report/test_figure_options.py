"""Comparison figures a paper can print: fitted axes, 12 groups told apart by colour, marker and line style, and
the options of `cfl report --plots` (groups, order, legend texts, colours, y range, size, PDF/SVG)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from cfl.app.cli import main
from tests.report import test_plots
from tests.report.test_plots_compare import write_run

saved_figures = test_plots.saved_figures  # the fixture: the figures as saved, by file name


def runs(root: Path, n: int) -> Path:
    """``n`` groups of fedavg differing in lr (2 seeds each), ACC 94.2 + 0.1 * i, curves between 90 and 100."""
    for i, seed in itertools.product(range(n), (0, 1)):
        write_run(root / f"g{i}s{seed}", {"name": "fedavg"}, seed, 94.2 + 0.1 * i + 0.05 * seed, 1.0 + 0.1 * i,
                  [[96.0, None], [95.0, 94.0]], {1: 90.0 + i * 0.5, 2: 95.0 + i * 0.3})
        path = root / f"g{i}s{seed}" / "results.json"
        path.write_text(path.read_text().replace('"lr": 0.05', f'"lr": {0.01 * (i + 1):.2f}'))
    return root


def curve_lines(fig: Figure) -> list[Any]:
    return [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]


def test_twelve_groups_differ_in_colour_marker_and_line_style(tmp_path: Path, saved_figures):
    assert main(["report", str(runs(tmp_path / "runs", 12)), "--plots", str(tmp_path / "fig")]) == 0
    lines = curve_lines(saved_figures["accuracy_curves.png"])
    assert len(lines) == 12
    # before: viridis colours without markers, neighbours a few percent apart
    assert len({line.get_marker() for line in lines}) == 12
    colours = [to_rgb(line.get_color()) for line in lines]
    closest = min(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5
                  for a, b in itertools.combinations(colours, 2))
    assert closest > 0.05
    for a, b in itertools.pairwise(lines):  # neighbours in the legend differ in line style too
        assert a.get_linestyle() != b.get_linestyle()


def test_axes_are_fitted_to_the_data(tmp_path: Path, saved_figures):
    assert main(["report", str(runs(tmp_path / "runs", 2)), "--plots", str(tmp_path / "fig")]) == 0
    low, high = saved_figures["acc_fgt.png"].axes[0].get_xlim()
    assert 90 < low < 94.2 and 94.4 < high < 96  # before: bars from 0, 94.2 against 94.3 alike
    low, high = saved_figures["accuracy_curves.png"].axes[0].get_ylim()
    assert 85 < low < 90 and 95.3 < high < 100  # before: 0-100


def test_y_range_full_and_figure_size_from_the_command_line(tmp_path: Path, saved_figures):
    assert main(["report", str(runs(tmp_path / "runs", 2)), "--plots", str(tmp_path / "fig"), "--y-range", "full",
                 "--figure-size", "5", "3"]) == 0
    assert saved_figures["accuracy_curves.png"].axes[0].get_ylim() == (-2, 102)
    assert tuple(saved_figures["accuracy_curves.png"].get_size_inches()) == (5, 3)


def test_a_style_file_chooses_groups_order_legends_colours_and_formats(tmp_path: Path, saved_figures, capsys):
    style = tmp_path / "style.yaml"
    style.write_text('groups:\n  - {group: fedavg lr=0.03, label: "FedAvg (lr 0.03)", color: "#000000"}\n'
                     "  - {group: fedavg lr=0.01}\ny_range: [50, 100]\nformats: [pdf, svg]\n")
    out = tmp_path / "fig"
    assert main(["report", str(runs(tmp_path / "runs", 3)), "--plots", str(out), "--plot-style", str(style)]) == 0
    lines = curve_lines(saved_figures["accuracy_curves.png"])
    assert [line.get_label() for line in lines] == ["FedAvg (lr 0.03)", "FedAvg lr=0.01"]
    assert to_rgb(lines[0].get_color()) == (0, 0, 0)
    assert saved_figures["accuracy_curves.png"].axes[0].get_ylim() == (50, 100)
    assert "left out (not in the style's groups): fedavg lr=0.02" in capsys.readouterr().out
    for name in ("acc_fgt", "acc_vs_fgt", "accuracy_curves", "acc_matrices"):
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF"), name
        assert b"<svg" in (out / f"{name}.svg").read_bytes()[:1000], name
    csv_groups = (out / "acc_fgt.csv").read_text().splitlines()[1:]
    assert [line.split(",")[0] for line in csv_groups] == ["fedavg lr=0.03", "fedavg lr=0.01"]
