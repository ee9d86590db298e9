"""The plugin guide's example (docs/examples/lwf.py) runs, matches the guide, and does what it says."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from cfl.engine.runner import Runner
from cfl.methods import METHODS
from cfl.validation import from_dict
from tests.conftest import make_stream

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "lwf.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("cfl_plugin_lwf_test", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _registry_restored():
    """Loading the example registers ``lwf`` in the global registry; later tests (the configuration
    reference) must not see it."""
    with METHODS.preserved():
        yield


def test_guide_shows_the_example_file_verbatim():
    assert EXAMPLE.read_text() in (ROOT / "docs" / "plugins.md").read_text()


def _cfg(**kw):
    base = {"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 3, "batch_size": 8, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": {"name": "lwf", "lam": 2.0}}
    base.update(kw)
    return from_dict(base)


def test_example_registers_and_batched_equals_sequential():
    module = _load_example()
    assert METHODS["lwf"] is module.LwF
    for scenario in ("task", "domain"):
        stream = make_stream(scenario, num_tasks=3)
        a, b = Runner(_cfg(), stream), Runner(_cfg(client_execution="sequential"), stream)
        a.run()
        b.run()
        for k in a.params:
            assert torch.allclose(a.params[k], b.params[k], atol=1e-5, rtol=1e-4), (scenario, k)


def test_distillation_is_zero_at_the_old_model_and_positive_away_from_it():
    module = _load_example()
    stream = make_stream("task", num_tasks=2)
    runner = Runner(_cfg(), stream)
    lwf = runner.methods[0]
    assert isinstance(lwf, module.LwF)
    state = {}
    from cfl.methods.base import ClientData

    task0 = stream.tasks[0]
    lwf.task_end_client(runner.model, runner.params, ClientData(task0.train_x, task0.train_y, 0), state, {}, None)
    x, t, w = task0.train_x[:5], torch.ones(5, dtype=torch.long), torch.ones(5)
    assert float(lwf.batch_loss(runner.params, x, t, w, {}, state)) < 1e-6
    moved = {k: v + 0.3 * torch.randn_like(v) for k, v in runner.params.items()}
    assert float(lwf.batch_loss(moved, x, t, w, {}, state)) > 1e-3
    # only the old task's head (0) is distilled: changing head 1 alone costs nothing
    head1 = dict(runner.params)
    head1["head.weight"] = head1["head.weight"].clone()
    head1["head.weight"][1] += 1.0
    assert float(lwf.batch_loss(head1, x, t, w, {}, state)) < 1e-6
