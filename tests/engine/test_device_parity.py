"""Every registered method (both engines) and every model trains on a device as on the CPU.

Runs only where ``CFL_TEST_DEVICE`` names a device (``cuda``: benchmarks/device_check.sh on a lent GPU machine;
``cpu``: the script's dry mode, which checks the script and these tests themselves end to end on any machine).
Each case trains the registry tests' tiny setting (two tasks, a few rounds, the method's own stream) twice from
the same seed, on the CPU and on the device, in float64 without dropout: there the two devices' kernels differ
only in the order of their sums, so the accuracy matrices must be equal and the parameters agree within
``atol=1e-8, rtol=1e-6`` (float32 would let rounding decide argmax ties and grow through training).
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from tests.conftest import any_method_models, method_spec, stream_for, tiny_config
from tests.engine.test_batched_equals_sequential import float64_without_dropout  # noqa: F401 - a fixture

DEVICE = os.environ.get("CFL_TEST_DEVICE")
#: methods whose tiny setting is heavy on a CPU (generators, proxy reconstructions): the dry mode leaves them out
DRY_METHODS = ("fedavg", "ewc", "fot")

pytestmark = [pytest.mark.skipif(not DEVICE, reason="set CFL_TEST_DEVICE=cuda (benchmarks/device_check.sh runs "
                                                    "these on a GPU machine; CFL_TEST_DEVICE=cpu: its dry mode)"),
              pytest.mark.usefixtures("float64_without_dropout")]


def _methods() -> list[str]:
    return sorted(METHODS) if DEVICE not in (None, "cpu") else list(DRY_METHODS)


def _train(cfg, stream, device: str) -> Runner:
    runner = Runner(replace(cfg, device=device), stream)
    runner.run()
    return runner


def _assert_alike(cpu: Runner, dev: Runner) -> None:
    assert cpu.progress.acc_matrix == dev.progress.acc_matrix
    for k, v in cpu.params.items():
        torch.testing.assert_close(dev.params[k].cpu(), v, atol=1e-8, rtol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("execution", ["batched", "sequential"])
@pytest.mark.parametrize("name", _methods())
def test_a_method_trains_on_the_device_as_on_the_cpu(name: str, execution: str) -> None:
    cfg = tiny_config(method=method_spec(name), client_execution=execution, rounds_per_task=2)
    stream = stream_for(name)
    _assert_alike(_train(cfg, stream, "cpu"), _train(cfg, stream, DEVICE))


@pytest.mark.parametrize("model", any_method_models() if DEVICE not in (None, "cpu") else ["mlp"])
def test_a_model_trains_on_the_device_as_on_the_cpu(model: str) -> None:
    from tests.engine.test_batched_equals_sequential import image_stream, smallest_image

    cfg = tiny_config(method={"name": "fedavg"}, rounds_per_task=2)
    cfg = replace(cfg, model=replace(cfg.model, name=model))
    stream = image_stream(smallest_image(model), "task")
    _assert_alike(_train(cfg, stream, "cpu"), _train(cfg, stream, DEVICE))
