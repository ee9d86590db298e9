"""Per-run figures: titles clear of the colorbar and inside the figure, integer round ticks, one line per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cfl.report.labels import run_title
from cfl.report.plots import task_curves, write_plots


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
    results = {"stream": "permuted-digits", "scenario": "domain", "method": "fot", "partition": "shards", "seed": 3,
               "num_tasks": num_tasks, "acc_matrix": matrix, "acc": 42.0, "fgt": 1.5,
               "config": {"method": {"name": "fot", "eps": 0.9, "eps_inc": 0.0}, "plugins": [],
                          "partition": {"name": "shards", "shards_per_client": 3, "alpha": 0.5, "min_samples": 1}}}
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


def test_titles_name_stream_scenario_method_parameters_partition_parameters_and_seed(tmp_path: Path,
                                                                                      saved_figures):
    results, evaluations = fake_run(3)
    write_plots(results, evaluations, 1, tmp_path)
    assert sorted(saved_figures) == ["acc_matrix.png", "accuracy_curve.png", "task_accuracy.png"]
    for name, fig in saved_figures.items():
        text = " ".join(t.get_text() for t in titles(fig)).replace("\n", " ")
        # the scenario and the shards count were missing before; alpha is not read by shards
        assert "permuted-digits (domain-IL) · FOT eps=0.9 · shards shards_per_client=3 · seed 3" in text, name


def test_method_parameters_at_their_defaults_are_not_named():
    results, _ = fake_run(2)
    results["config"]["method"]["eps"] = 0.96  # fot's default
    assert run_title(results) == "permuted-digits (domain-IL) · FOT · shards shards_per_client=3 · seed 3"


def test_class_and_task_incremental_runs_have_different_titles():
    results, _ = fake_run(2)
    titles_ = {run_title({**results, "scenario": s}) for s in ("class", "task")}
    assert len(titles_) == 2


def test_a_sweep_variant_label_names_the_run_with_its_changed_parameters():
    results, _ = fake_run(2)
    results["config"]["label"] = "fot-wide"
    assert run_title(results).split(" · ")[1] == "fot-wide eps=0.9"


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
    assert [line.get_label() for line in curves] == ["task 0", "task 1", "task 2"]  # as in results.json
    assert list(curves[2].get_xdata()) == [5, 6]
    boundaries = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    assert boundaries == [2, 4]


def test_round_ticks_are_the_task_boundaries_and_the_last_marker_is_inside(tmp_path: Path, saved_figures):
    results, evaluations = fake_run(4, rounds_per_task=5)
    write_plots(results, evaluations, 5, tmp_path)
    for name in ("accuracy_curve.png", "task_accuracy.png"):
        ax = saved_figures[name].axes[0]
        assert list(ax.get_xticks()) == [0, 5, 10, 15, 20], name  # before: matplotlib's 0, 2.5, 5, ...
        assert ax.get_xlim()[1] > 20, name  # before: the axis ended on the last round, halving its marker


def test_accuracy_axes_are_fitted_and_clear_of_a_curve_at_100(tmp_path: Path, saved_figures):
    results, evaluations = fake_run(2, rounds_per_task=2)
    for e in evaluations:  # accuracies between 90 and 100
        e["acc"] = {k: 100.0 - 5 * int(k) - (e["round"] % 2) * 5 for k in e["acc"]}
        e["mean_acc"] = sum(e["acc"].values()) / len(e["acc"])
    write_plots(results, evaluations, 2, tmp_path)
    for name in ("accuracy_curve.png", "task_accuracy.png"):
        low, high = saved_figures[name].axes[0].get_ylim()
        assert 80 < low < 92.5 and 100 < high < 102, (name, low, high)  # before: 0 and 100, the frame on the curve


def test_matrix_ticks_number_tasks_from_0_as_results_json(tmp_path: Path, saved_figures):
    results, evaluations = fake_run(3)
    write_plots(results, evaluations, 1, tmp_path)
    ax = saved_figures["acc_matrix.png"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
