"""A run on an untrained backbone (results.json's ``random_backbone``) is flagged "(random backbone)" in every
table row, figure legend and LaTeX label, also where a sweep variant's ``label`` names its row (numbers
from a random backbone must never pass for pretrained ones); ordering by the plain label still finds the row."""

from __future__ import annotations

import json
from pathlib import Path

from cfl.report.compare_data import all_series
from cfl.report.groups import group_runs, load_runs
from cfl.report.latex_table import display_labels
from cfl.report.table import TableOptions, report


def write_run(path: Path, seed: int, label: str, method: str, random: bool) -> None:
    """A labelled run's results.json as a pretrained-backbone run writes it (its method already flagged)."""
    path.mkdir(parents=True)
    weights = "random" if random else "/w/vit.safetensors"
    body = {"stream": "split-digits", "scenario": "class", "partition": "iid", "seed": seed, "acc": 50.0 + seed,
            "fgt": 1.0, "complete": True, "random_backbone": random,
            "method": f"{method} (random backbone)" if random else method,
            "config": {"seed": seed, "label": label, "method": {"name": method},
                       "model": {"name": "vit-ti16", "weights": weights}}}
    (path / "results.json").write_text(json.dumps(body))


def method_cells(table: str) -> list[str]:
    return [line.split("|")[1].strip() for line in table.splitlines()[2:]]


def test_a_labelled_random_backbone_row_says_so_and_a_pretrained_one_does_not(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path / f"probe{seed}", seed, "linear-probe", "fedavg", random=True)
        write_run(tmp_path / f"l2p{seed}", seed, "l2p", "l2p", random=True)
        write_run(tmp_path / f"real{seed}", seed, "l2p-real", "l2p", random=False)
    table = report([tmp_path], options=TableOptions(columns=("method", "acc"),
                                                 order=("linear-probe", "l2p", "l2p-real")))
    assert method_cells(table) == ["linear-probe (random backbone)", "l2p (random backbone)", "l2p-real"]
    groups = group_runs(load_runs([tmp_path]))
    assert sorted(display_labels(groups)) == ["l2p (random backbone)", "l2p-real", "linear-probe (random backbone)"]
    assert sorted(s.legend for s in all_series(groups)) == sorted(display_labels(groups))
