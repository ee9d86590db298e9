"""The plugin guide's examples (docs/examples/lwf.py, gpm_like.py) run, match the guide, do what they say, and
train on the engine path the guide states, with the reason printed."""

from pathlib import Path

import pytest
import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.validation import from_dict
from tests.conftest import make_stream
from tests.helpers import load_plugin_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "lwf.py"
GPM_LIKE = ROOT / "docs" / "examples" / "gpm_like.py"


def _load_example(path: Path = EXAMPLE):
    return load_plugin_file(path)


@pytest.fixture(autouse=True)
def _registry_restored():
    """Loading the example registers ``lwf`` in the global registry; later tests (the configuration
    reference) must not see it."""
    with METHODS.preserved():
        yield


@pytest.mark.parametrize("path", [EXAMPLE, GPM_LIKE], ids=["lwf", "gpm_like"])
def test_guide_shows_the_example_files_verbatim(path):
    assert path.read_text() in (ROOT / "docs" / "plugins.md").read_text()


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
    lwf.client_end(ClientEndContext("task_end", runner.model, runner.params, ClientData(task0.train_x, task0.train_y,
                                                                                        0), state, {}, None))
    x, t = task0.train_x[:5], torch.ones(5, dtype=torch.long)
    assert lwf.loss(LossContext("extra", runner.params, x, t, torch.ones(len(x)), {}, state)).extra.shape == (5,)
    assert float(lwf.loss(LossContext("extra", runner.params, x, t, torch.ones(len(x)), {}, state)).extra.max()) < 1e-6
    moved = {k: v + 0.3 * torch.randn_like(v) for k, v in runner.params.items()}
    assert float(lwf.loss(LossContext("extra", moved, x, t, torch.ones(len(x)), {}, state)).extra.mean()) > 1e-3
    # only the old task's head (0) is distilled: changing head 1 alone costs nothing
    head1 = dict(runner.params)
    head1["head.weight"] = head1["head.weight"].clone()
    head1["head.weight"][1] += 1.0
    assert float(lwf.loss(LossContext("extra", head1, x, t, torch.ones(len(x)), {}, state)).extra.max()) < 1e-6


@pytest.mark.parametrize(("path", "name", "hook"), [(EXAMPLE, "lwf", "declares losses 'extra'"),
                                                     (GPM_LIKE, "gpm-like", "declares terms 'projection'")])
def test_examples_print_their_engine_path_and_reason_once(path, name, hook, capsys):
    _load_example(path)
    runner = Runner(_cfg(method={"name": name}), make_stream("task", num_tasks=2))
    runner.run()
    err = capsys.readouterr().err
    line = f"engine: vmap path (reason: method {name} {hook}"
    assert err.count("engine: ") == 1 and line in err
    assert runner.snapshot().engine_path["path"] == "vmap"


def test_gpm_like_example_projects_and_batched_equals_sequential():
    module = _load_example(GPM_LIKE)
    stream = make_stream("domain", num_tasks=3)
    cfg = {"method": {"name": "gpm-like", "energy": 0.9}, "partition": {"name": "quantity", "beta": 0.5}}
    a, b = Runner(_cfg(**cfg), stream), Runner(_cfg(client_execution="sequential", **cfg), stream)
    a.run()
    b.run()
    for k in a.params:
        assert torch.allclose(a.params[k], b.params[k], atol=1e-5, rtol=1e-4), k
    clients = a.states[0].clients
    bases = [clients.get(c)["bases"]["body.1.weight"] for c in clients.ids()]
    assert isinstance(a.methods[0], module.GPMLike) and len(bases) == 4
    assert len({m.shape[1] for m in bases}) > 1  # ragged widths, padded by the engine
    m = bases[0]
    assert torch.allclose(m.T @ m, torch.eye(m.shape[1]), atol=1e-4)  # orthonormal
