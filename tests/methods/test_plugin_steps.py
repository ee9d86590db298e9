"""The plugin guide's step-hook tutorial (docs/examples/si_steps.py, agem_steps.py): the files are shown in the
guide verbatim, `my-si` gives the built-in `si`'s numbers, and both train alike on the batched and sequential
engines, on the path the guide states."""

from pathlib import Path

import pytest
import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.validation import from_dict
from tests.conftest import make_stream
from tests.helpers import load_plugin_file as _load

ROOT = Path(__file__).resolve().parents[2]
SI = ROOT / "docs" / "examples" / "si_steps.py"
AGEM = ROOT / "docs" / "examples" / "agem_steps.py"


@pytest.fixture(autouse=True)
def _registry_restored():
    with METHODS.preserved():
        yield


def _cfg(method: dict, **kw):
    base = {"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
            "partition": {"name": "quantity", "beta": 0.5}, "wandb": {"mode": "disabled"}, "method": method}
    base.update(kw)
    return from_dict(base)


@pytest.mark.parametrize("path", [SI, AGEM], ids=["si", "agem"])
def test_guide_shows_the_step_hook_examples_verbatim(path):
    assert path.read_text() in (ROOT / "docs" / "plugins.md").read_text()


def _run(cfg, stream) -> Runner:
    runner = Runner(cfg, stream)
    runner.run()
    return runner


def test_my_si_from_the_guide_gives_the_built_in_si_numbers(capsys):
    _load(SI)
    stream = make_stream("task", num_tasks=3)
    mine = _run(_cfg({"name": "my-si", "c": 0.5}), stream)
    reason = "engine: vmap path (reason: method my-si declares starts 'carry', a step hook"
    assert reason in capsys.readouterr().err
    built_in = _run(_cfg({"name": "si", "c": 0.5}), stream)
    for k in built_in.params:
        assert torch.equal(mine.params[k], built_in.params[k]), k
    fedavg = _run(_cfg({"name": "fedavg"}), stream)
    assert any(not torch.allclose(fedavg.params[k], mine.params[k]) for k in fedavg.params)  # SI acted


@pytest.mark.parametrize(("path", "name"), [(SI, "my-si"), (AGEM, "my-agem")])
def test_step_hook_examples_train_alike_on_both_engines(path, name):
    _load(path)
    stream = make_stream("task", num_tasks=3)
    batched = _run(_cfg({"name": name}), stream)
    sequential = _run(_cfg({"name": name}, client_execution="sequential"), stream)
    for k in batched.params:
        assert torch.allclose(batched.params[k], sequential.params[k], atol=1e-5, rtol=1e-4), k
    states = batched.states[0].clients
    assert len(states.ids()) == 4  # every client took part in the task ends and holds its state


def test_my_agem_projects_only_a_conflicting_step():
    module = _load(AGEM)
    from cfl.plugin import Samples, Step

    ref = {"w": torch.tensor([1.0, 0.0])}
    method = module.MyAGEM.__new__(module.MyAGEM)

    def step_with(g):
        return Step({"w": torch.zeros(2)}, {"w": g}, None, None, None, None,
                    Samples(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                            torch.ones(1)), {}, {}, {}, {}, 0.1, 0, lambda *_: ref)

    # g . g_ref = -2 < 0: g - (-2 / 1) g_ref = (-2, 3) + (2, 0) = (0, 3), orthogonal to g_ref
    assert torch.equal(method.step_gradient(step_with(torch.tensor([-2.0, 3.0])))["w"], torch.tensor([0.0, 3.0]))
    # g . g_ref = 2 > 0: unchanged
    assert torch.equal(method.step_gradient(step_with(torch.tensor([2.0, 3.0])))["w"], torch.tensor([2.0, 3.0]))


DERPP = ROOT / "docs" / "examples" / "derpp_steps.py"


def test_guide_shows_the_derpp_example_verbatim():
    assert DERPP.read_text() in (ROOT / "docs" / "plugins.md").read_text()


def test_my_derpp_from_the_guide_gives_the_built_in_derpp_numbers(capsys):
    _load(DERPP)
    stream = make_stream("task", num_tasks=2)
    mine = _run(_cfg({"name": "my-derpp", "size": 20}), stream)
    assert "engine: vmap path (reason: method my-derpp declares losses 'extra'" in capsys.readouterr().err
    built_in = _run(_cfg({"name": "derpp", "mem_per_client": 20}), stream)
    assert mine.progress.acc_matrix == built_in.progress.acc_matrix
    for k in mine.params:
        assert torch.allclose(mine.params[k], built_in.params[k], atol=1e-6), k
    plain = _run(_cfg({"name": "fedavg"}), stream)
    assert not torch.allclose(mine.params["head.weight"], plain.params["head.weight"])  # the memory acts
    sequential = _run(_cfg({"name": "my-derpp", "size": 20}, client_execution="sequential"), stream)
    for k in mine.params:
        assert torch.allclose(mine.params[k], sequential.params[k], atol=1e-5, rtol=1e-4), k
