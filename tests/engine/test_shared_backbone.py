"""The route by which a method changes the shared frozen backbone (``ServerChange.backbone``,
cfl/engine/rounds/shared_backbone.py): the declaration it needs, the models it is refused on, the checks of what it
returns, the deltas added once into the one backbone, and the bytes each client downloads once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cfl.config.schema import ConfigError
from cfl.engine.rounds.shared_backbone import SharedBackbone
from cfl.methods.base import BackboneUpdate, Method, Requires, Sends
from cfl.methods.hook_guard import BrokenRule
from cfl.records.snapshot import Progress


class _Merger(Method):
    name = "merger"
    requires = Requires(schedules=("synchronous",))
    sends = Sends(changes_backbone=True, server_events=("task_end",))

    def server_event(self, ctx):  # noqa: ARG002
        return None


def test_a_method_that_changes_the_backbone_must_declare_the_synchronous_schedule():
    with pytest.raises(TypeError, match="declare requires = Requires\\(schedules=\\('synchronous',\\)"):
        type("Merger", (Method,), {"server_event": _Merger.server_event, "sends": Sends(changes_backbone=True)})
    declared = type("Merger", (Method,), {"server_event": _Merger.server_event, "sends": Sends(changes_backbone=True),
                                          "requires": Requires(schedules=("synchronous",))})
    assert declared.requires.schedules == ("synchronous",)


@pytest.mark.parametrize(("model", "words"), [
    ({"name": "vit-ti16", "train": "head"}, "features cached from the unchanged backbone"),
    ({"name": "vit-ti16", "train": "all"}, "no shared frozen part"),
    ({"name": "mlp", "train": "head"}, "model mlp has none"),
])
def test_a_backbone_change_is_refused_without_a_shared_frozen_backbone_run_at_every_step(model, words):
    from cfl.cross_checks import check_backbone_changes

    cfg = SimpleNamespace(model=SimpleNamespace(**model))
    with pytest.raises(ConfigError, match=f"method merger changes the shared frozen backbone.*{words}"):
        check_backbone_changes(cfg, [_Merger])
    check_backbone_changes(cfg, [Method])  # a method that changes nothing: no refusal
    check_backbone_changes(SimpleNamespace(model=SimpleNamespace(name="vit-ti16", train="lora")), [_Merger])


class _Frozen(nn.Module):
    """A frozen 2 x 3 weight (a buffer, as cfl's adapted backbones hold it), a BatchNorm and a trained bias."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(2, 3), persistent=False)
        self.norm = nn.BatchNorm1d(2)
        self.bias = nn.Parameter(torch.zeros(2))


def test_what_the_hook_returns_is_checked():
    from cfl.models.buffers import running_stats

    model = _Frozen()
    shared = SharedBackbone(model, running_stats(model))
    assert list(shared.frozen) == ["weight"]  # not the running statistics
    assert shared.check(None) is None
    for bad, words in [({"norm.running_mean": torch.zeros(2)}, "not a frozen buffer"),
                       ({"weight": torch.zeros(3, 2)}, "shape \\(2, 3\\)"),
                       ({"weight": torch.full((2, 3), float("nan"))}, "NaN or inf")]:
        with pytest.raises(BrokenRule, match=words):
            shared.check(BackboneUpdate(bad))
    with pytest.raises(BrokenRule, match="BackboneUpdate"):
        shared.check({"weight": torch.zeros(2, 3)})


def test_deltas_add_into_the_one_backbone_and_each_client_downloads_the_changes_once(capsys):
    model = _Frozen()
    shared = SharedBackbone(model, {})
    progress = Progress()
    assert shared.download_bytes([0, 1], progress) == 0
    shared.apply({"weight": torch.full((2, 3), 0.5, dtype=torch.float64)}, "merger", 0, progress)
    assert torch.equal(model.weight, torch.full((2, 3), 1.5)) and model.weight.dtype == torch.float32
    assert progress.backbone_changes == [{"task": 0, "method": "merger", "tensors": ["weight"], "values": 6,
                                          "bytes": 24}]
    assert "method merger changed 1 tensors of the shared frozen backbone at the end of task 0" in \
        capsys.readouterr().err
    assert shared.download_bytes([0], progress) == 24  # client 0's next round
    assert shared.download_bytes([0, 1], progress) == 24  # client 0 has it; client 1 gets it
    shared.apply({"weight": torch.ones(2, 3)}, "merger", 1, progress)
    assert shared.download_bytes([0, 2], progress) == 24 + 24  # client 2, behind by two changes: the tensor once
    resumed = SharedBackbone(_Frozen(), {})
    resumed.load(shared.changed)
    assert torch.equal(resumed.frozen["weight"], model.weight)
    with pytest.raises(ValueError, match="not a frozen buffer"):
        resumed.load({"weight": torch.zeros(3)})
