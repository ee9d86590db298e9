"""Per-run figures: titles clear of the colorbar and inside the figure, integer round ticks, one line per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cfl.report.plots import task_curves, write_plots
from cfl.report.titles import method_with_params, run_title


def fake_run(num_tasks: int, rounds_per_task: int = 1) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A finished run: task t's accuracy is 50 + t when first trained and falls by 1 per later round."""
    evaluations, matrix = [], []
    for t in range(num_tasks):
        for r in range(rounds_per_task):
            rnd = t * rounds_per_task + r + 1
            acc = {str(j): 50.0 + j - (rnd - (j + 1) * rounds_per_task) for j in range(t + 1)}
            evaluations.append({"task": t, "round": rnd, "final": r == rounds_per_task - 1, "acc": acc,
                                "mean_acc": sum(acc.values()) / len(acc)})
        matrix.append([evaluations[-1]["acc"].get(str(j)) for j in range(num_tasks)])
    results = {"stream": "permuted-digits", "method": "fot", "partition": "shards", "seed": 3,
               "num_tasks": num_tasks, "acc_matrix": matrix, "acc": 42.0, "fgt": 1.5,
               "config": {"method": {"name": "fot", "eps": 0.9, "eps_inc": 0.0}, "plugins": []}}
    return results, evaluations


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """The figures written by the plotting code, by file name, drawn as saved."""
    figures: dict[str, Figure] = {}
    original = Figure.savefig

    def capture(fig: Figure, path: Any, *args: Any, **kwargs: Any) -> None:
        original(fig, path, *args, **kwargs)
        figures[Path(path).name] = fig

    monkeypatch.setattr(Figure, "savefig", capture)
    return figures


def titles(fig: Figure) -> list[Any]:
    texts = [ax.title for ax in fig.axes if ax.get_title()]
    return texts + ([fig._suptitle] if fig._suptitle is not None else [])  # noqa: SLF001 - no public getter


@pytest.mark.parametrize("num_tasks", [2, 3, 5, 10])
def test_matrix_title_is_inside_the_figure_and_clear_of_the_colorbar(tmp_path: Path, saved_figures, num_tasks):
    results, evaluations = fake_run(num_tasks)
    write_plots(results, evaluations, 1, tmp_path)
    fig = saved_figures["acc_matrix.png"]
    renderer = FigureCanvasAgg(fig).get_renderer()  # pyplot has closed it
    [title] = titles(fig)
    box = title.get_window_extent(renderer)
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
    for ax in fig.axes:
        assert not box.overlaps(ax.get_tightbbox(renderer)), "the title overlaps an axis or the colorbar"


def test_titles_name_stream_method_parameters_partition_and_seed(tmp_path: Path, saved_figures):
    results, evaluations = fake_run(3)
    write_plots(results, evaluations, 1, tmp_path)
    assert sorted(saved_figures) == ["acc_matrix.png", "accuracy_curve.png", "task_accuracy.png"]
    for name, fig in saved_figures.items():
        text = " ".join(t.get_text() for t in titles(fig)).replace("\n", " ")
        assert "permuted-digits · fot (eps=0.9) · shards · seed 3" in text, name


def test_method_parameters_at_their_defaults_are_not_named():
    results, _ = fake_run(2)
    results["config"]["method"]["eps"] = 0.96  # fot's default
    assert method_with_params(results) == "fot"
    assert run_title(results) == "permuted-digits · fot · shards · seed 3"


@pytest.mark.parametrize("name", ["accuracy_curve.png", "task_accuracy.png"])
def test_round_ticks_are_integers(tmp_path: Path, saved_figures, name):
    results, evaluations = fake_run(2, rounds_per_task=1)  # 2 rounds: matplotlib's default ticks are 0.25 apart
    write_plots(results, evaluations, 1, tmp_path)
    ax = saved_figures[name].axes[0]
    low, high = ax.get_xlim()
    ticks = [x for x in ax.get_xticks() if low <= x <= high]
    assert len(ticks) >= 2 and all(float(x).is_integer() for x in ticks)


def test_task_curves_follow_each_task_from_its_first_round():
    _, evaluations = fake_run(3, rounds_per_task=2)
    # task 0 seen from round 1: 50 - (r - 2); task 1 from round 3: 51 - (r - 4); task 2 from round 5: 52 - (r - 6)
    assert task_curves(evaluations, 3) == [([1, 2, 3, 4, 5, 6], [51, 50, 49, 48, 47, 46]),
                                           ([3, 4, 5, 6], [52, 51, 50, 49]),
                                           ([5, 6], [53, 52])]


def test_task_accuracy_figure_has_one_line_per_task_and_task_boundaries(tmp_path: Path, saved_figures):
    results, evaluations = fake_run(3, rounds_per_task=2)
    write_plots(results, evaluations, 2, tmp_path)
    assert (tmp_path / "task_accuracy.png").stat().st_size > 0
    ax = saved_figures["task_accuracy.png"].axes[0]
    curves = [line for line in ax.get_lines() if line.get_label().startswith("task")]
    assert [line.get_label() for line in curves] == ["task 1", "task 2", "task 3"]
    assert list(curves[2].get_xdata()) == [5, 6]
    boundaries = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    assert boundaries == [2, 4]
