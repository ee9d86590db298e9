"""The frozen queries of the key-query prompt methods, computed once per sample and packed beside each image
(cfl/pretrained/queries.py): bit for bit the backbone's pass over the same batch, and the per-step pass of any
other batch up to float rounding (a product's rows round by their place in it), for every model.train that reads
a query; a round on packed rows equal, to rounding, to one that recomputes them at every step; cached on disk and
checked like the features; a wrong input width and a backbone change refused, by name."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")

from cfl.engine.rounds.shared_backbone import SharedBackbone  # noqa: E402
from cfl.methods.hook_guard import BrokenRule  # noqa: E402
from cfl.methods.hook_types import BackboneUpdate  # noqa: E402
from cfl.pretrained.queries import QUERY_MODES, PackedLayout, packed  # noqa: E402
from cfl.validation import from_dict  # noqa: E402
from tests.conftest import make_stream  # noqa: E402

SIZE = 32
METHOD = {"prompts": "l2p", "components": "codap", "task-components": "powder", "dual-prompts": "dualprompt"}
MODEL = {"prompts": {"prompt_pool": 4, "prompt_length": 2, "prompt_top_k": 2},
         "components": {"prompt_pool": 4, "prompt_length": 4, "component_layers": 2},
         "task-components": {"prompt_pool": 2, "prompt_length": 2, "prompt_blocks": [0, 1]},
         "dual-prompts": {"prompt_pool": 4, "prompt_length": 2, "prompt_top_k": 1}}


def config(tmp_path: Path, train: str):
    scenario = "task" if train == "task-components" else "class"  # Powder: task-incremental only
    return from_dict({"stream": {"name": "split-digits", "num_tasks": 2, "scenario": scenario},
                      "model": {"name": "vit-ti16", "weights": "random", "image_size": SIZE, "train": train,
                                **MODEL[train]},
                      "method": {"name": METHOD[train]}, "num_clients": 3, "clients_per_round": 3,
                      "rounds_per_task": 1, "batch_size": 8, "lr": 0.01, "data_root": str(tmp_path / "data"),
                      "wandb": {"mode": "disabled"}})


def runner(cfg, quiet: bool = True):
    from cfl.engine.rounds.runner import Runner
    from cfl.pretrained.features import with_backbone

    stream = make_stream(cfg.stream.scenario, num_tasks=2, image=(1, 8, 8), n_train=24, n_test=8)
    return Runner(cfg, with_backbone(cfg, stream, torch.device("cpu"), quiet=quiet))


def unpacked(r) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A copy of the run's model that computes its queries itself, the task-0 packed rows and their images."""
    model = r.model
    plain = copy.deepcopy(model)
    plain.layout = None
    x = r.stream.tasks[0].train_x
    return plain, x, model.layout.split(x)[0]


def test_the_layout_splits_rows_back_into_images_and_queries():
    images, queries = torch.arange(24.0).view(2, 3, 2, 2), torch.tensor([[100.0, 101], [200, 201]])
    rows = packed(images, queries)
    assert rows.shape == (2, 14) and rows[1, -1] == 201 and rows[0, 11] == 11
    got_images, got_queries = PackedLayout((3, 2, 2), 2).split(rows)
    assert torch.equal(got_images, images) and torch.equal(got_queries, queries)
    with pytest.raises(ValueError, match=r"packed rows of 12 image values \(3, 2, 2\) and a 2-value query"):
        PackedLayout((3, 2, 2), 2).split(images.flatten(1))


@pytest.mark.parametrize("train", QUERY_MODES)
def test_packed_queries_equal_the_per_step_pass_bit_for_bit(tmp_path, train):
    r = runner(config(tmp_path, train))
    plain, x, images = unpacked(r)
    assert r.stream.input_shape == (3 * 8 * 8 + 192,)
    assert torch.equal(r.model.query(x), plain.query(images))  # one batch of every sample, as they were computed
    for start in (0, 5):  # per-step batches of 8 at two offsets: the same values up to the products' rounding
        batch = slice(start, start + 8)
        torch.testing.assert_close(r.model.query(x[batch]), plain.query(images[batch]), rtol=1e-5, atol=1e-5)
        task = torch.zeros(8, dtype=torch.long)
        for mode in (True, False):  # training (DualPrompt's task E-prompts) and evaluation
            r.model.train(mode)
            plain.train(mode)
            torch.testing.assert_close(r.model(x[batch], task), plain(images[batch], task), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="packed rows of 192 image values"):
        r.model(images[:2], torch.zeros(2, dtype=torch.long))


def test_a_round_on_packed_rows_equals_one_that_recomputes_the_queries(tmp_path):
    """The run's round against the same round whose model computes each query at every step (the old path): the
    same parameters up to float rounding, and not those of a round on other queries (the test can fail)."""
    packed_run = runner(config(tmp_path, "prompts"))
    per_step = runner(config(tmp_path, "prompts"))
    layout, per_step.model.layout = per_step.model.layout, None  # the model every hook reads computes its queries
    for task in per_step.stream.tasks:
        task.train_x = layout.split(task.train_x)[0]
    start = {k: v.clone() for k, v in packed_run.params.items()}
    packed_run.run_round(0, 0)
    per_step.run_round(0, 0)
    for k in packed_run.params:
        torch.testing.assert_close(packed_run.params[k], per_step.params[k], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(packed_run.params[k], start[k], atol=1e-4) for k in start)


def test_the_queries_are_cached_and_a_damaged_file_recomputed(tmp_path, capsys):
    cfg = config(tmp_path, "prompts")
    first = runner(cfg, quiet=False)
    assert "queries: the frozen vit-ti16 [CLS] query of each of 64 samples" in capsys.readouterr().err
    path = Path(first.stream.info["backbone"]["queries"]["cache"])
    assert path.parent.name == "queries" and path.is_file()
    again = runner(cfg, quiet=False)
    assert "loaded from the cache" in capsys.readouterr().err
    assert torch.equal(again.stream.tasks[1].test_x, first.stream.tasks[1].test_x)
    payload = torch.load(path, weights_only=True)
    payload["features"][0]["train"][0, 0] += 1.0
    torch.save(payload, path)
    with pytest.warns(UserWarning, match="digest differs"):
        third = runner(cfg, quiet=False)
    assert "computed in" in capsys.readouterr().err
    assert torch.equal(third.stream.tasks[0].train_x, first.stream.tasks[0].train_x)


def test_a_backbone_change_under_packed_queries_is_refused(tmp_path):
    r = runner(config(tmp_path, "prompts"))
    shared = SharedBackbone(r.model, {})
    name = next(iter(shared.frozen))
    with pytest.raises(BrokenRule, match="computed once from the frozen backbone"):
        shared.check(BackboneUpdate({name: torch.zeros_like(shared.frozen[name])}, {}))
