"""``model.weights_origin``: a weights file that is not what a reader would assume (the in-house backbone, not
ImageNet) is named in parentheses after the method in results.json, every table row (a sweep variant's label
too), figure legend and W&B name; refused where it could not be true (a random backbone, a model trained from
scratch, an empty text) before any data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")
pytest.importorskip("safetensors", reason="the pretrained backbones need the extra pretrained")

from safetensors.torch import save_file  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402
from cfl.pretrained.backbones import build_backbone  # noqa: E402
from cfl.validation import from_dict  # noqa: E402
from tests.weights_files import as_trained  # noqa: E402

ORIGIN = "in-house backbone, not ImageNet"


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("weights") / "vit-ti16.safetensors"
    save_file({k: v.contiguous() for k, v in as_trained(build_backbone("vit-ti16", 32).state_dict()).items()},
              str(path))
    return path


def config(tmp_path: Path, **model: object) -> dict:
    return {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class"}, "label": "probe",
            "model": {"name": "vit-ti16", "image_size": 32, **model}, "num_clients": 2, "clients_per_round": 2,
            "rounds_per_task": 1, "batch_size": 16, "method": {"name": "fedncm"},
            "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}}


def test_the_origin_is_in_results_the_row_the_legend_and_the_wandb_name(weights, tmp_path):
    from cfl.app.single_run import execute
    from cfl.report.compare_data import all_series
    from cfl.report.groups import group_runs, load_runs
    from cfl.report.table import TableOptions, report
    from cfl.report.wandb_names import shown_method

    cfg = from_dict(config(tmp_path, weights=str(weights), weights_origin=ORIGIN))
    results = execute(cfg, tmp_path / "runs" / "run", quiet=True)
    assert results["method"] == f"fedncm ({ORIGIN})" and results["backbone"]["origin"] == ORIGIN
    assert results["random_backbone"] is False and results["display_label"].endswith(f"({ORIGIN})")
    assert json.loads((tmp_path / "runs" / "run" / "results.json").read_text())["method"] == f"fedncm ({ORIGIN})"
    assert shown_method(cfg) == f"probe ({ORIGIN})"
    table = report([tmp_path / "runs"], options=TableOptions(columns=("method", "acc"), order=("probe",)))
    assert table.splitlines()[2].split("|")[1].strip() == f"probe ({ORIGIN})"  # the label flagged, --order finds it
    assert [s.legend for s in all_series(group_runs(load_runs([tmp_path / "runs"])))] == [f"probe ({ORIGIN})"]


def test_without_an_origin_nothing_is_added(weights, tmp_path):
    from cfl.app.single_run import execute

    results = execute(from_dict(config(tmp_path, weights=str(weights))), tmp_path / "run", quiet=True)
    assert results["method"] == "fedncm" and "origin" not in results["backbone"]


@pytest.mark.parametrize(("model", "words"), [
    ({"weights": "random", "weights_origin": ORIGIN}, "flagged '(random backbone)' already"),
    ({"weights": "WEIGHTS", "weights_origin": "  "}, "it is empty"),
    ({"name": "mlp", "image_size": None, "weights_origin": ORIGIN}, "read only by the pretrained backbones"),
])
def test_an_origin_that_cannot_be_true_is_refused(weights, tmp_path, model, words):
    model = {k: str(weights) if v == "WEIGHTS" else v for k, v in model.items()}
    cfg = config(tmp_path, **model)
    if model.get("name") == "mlp":
        cfg.update(stream={"name": "permuted-digits", "num_tasks": 2}, method={"name": "fedavg"})
    with pytest.raises(ConfigError, match="weights_origin") as err:
        from_dict(cfg)
    assert words in str(err.value)
