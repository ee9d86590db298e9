"""Test helpers for the two runs every method's tests compare: the batched trainer against the sequential one,
and a run killed after a checkpoint and resumed against one run straight through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch


def assert_batched_equals_sequential(batched: Any, sequential: Any) -> None:
    """Two finished runners of one config, batched (on the vmap path) and sequential: same parameters to float32
    summation order, same accuracy matrix."""
    assert batched.engine_path.path == "vmap"
    for k in batched.params:
        assert torch.allclose(batched.params[k], sequential.params[k], atol=1e-5, rtol=1e-4), k
    assert batched.progress.acc_matrix == sequential.progress.acc_matrix


def killed_and_resumed(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       after_round: int = 3) -> tuple[dict, dict]:
    """``cfg`` run straight through into ``tmp_path/full``, and into ``tmp_path/part`` killed after the
    checkpoint of global round ``after_round`` and resumed there: both runs' results."""
    from cfl.app.single_run import Checkpointer, execute, resume_config

    full = execute(cfg, tmp_path / "full", quiet=True)
    saving = Checkpointer.__call__

    def killed_after_round(self) -> None:  # the run dies after the checkpoint of that round
        saving(self)
        if self.runner.progress.global_round >= after_round:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "__call__", killed_after_round)
    with pytest.raises(Exception):  # noqa: B017 - RunStopped, whichever signal code
        execute(cfg, tmp_path / "part", quiet=True)
    monkeypatch.setattr(Checkpointer, "__call__", saving)
    resumed = execute(resume_config(tmp_path / "part", []), tmp_path / "part", quiet=True, resume=True)
    return full, resumed


def checkpointed_params(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["params"]


def assert_resumes_bit_identically(cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   after_round: int = 3) -> None:
    """``cfg`` killed after the checkpoint of global round ``after_round`` and resumed equals one run straight
    through: accuracy matrix, bytes and every checkpointed parameter."""
    full, resumed = killed_and_resumed(cfg, tmp_path, monkeypatch, after_round)
    assert resumed["acc_matrix"] == full["acc_matrix"] and resumed["upload_bytes"] == full["upload_bytes"]
    assert resumed["download_bytes"] == full["download_bytes"]
    final, reference = checkpointed_params(tmp_path / "part"), checkpointed_params(tmp_path / "full")
    assert all(torch.equal(final[k], reference[k]) for k in reference)


def tiny_pretrained_runner(cfg: Any) -> Any:
    """A Runner of ``cfg`` (a random ViT-Ti/16 config) on a generated class-incremental stream of 2 tasks of
    1 x 8 x 8 images, 24 train and 8 test a task, normalised for the backbone."""
    from cfl.engine.rounds.runner import Runner
    from cfl.pretrained.features import with_backbone
    from tests.conftest import make_stream

    stream = make_stream("class", num_tasks=2, image=(1, 8, 8), n_train=24, n_test=8)
    return Runner(cfg, with_backbone(cfg, stream, torch.device("cpu"), quiet=True))
