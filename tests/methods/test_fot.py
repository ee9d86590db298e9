"""FOT: GPSE recovers the global principal subspace, FedProject keeps old outputs, traffic is counted."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.fot import FOT, FOTHyperparams
from cfl.methods.server_hooks import ServerEvent, TransformUpdate
from cfl.methods.training_hooks import ClientEndContext
from cfl.metrics.results import method_stats
from cfl.models import ModelShape, build_model
from cfl.models.layers import protected_layers
from cfl.ops.gpse import client_sketch, residual_ratio, server_extend
from cfl.records.client_states import MethodState
from cfl.validation import from_dict
from tests.conftest import any_method_models, make_stream, run_both_paths


def _low_rank(d: int, energies: list[float], n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, U0): n columns in the span of the orthonormal U0 (d x r) with roughly the given energy shares."""
    gen = torch.Generator().manual_seed(seed)
    u0 = torch.linalg.qr(torch.randn(d, len(energies), generator=gen))[0]
    coeffs = torch.randn(len(energies), n, generator=gen)
    coeffs = coeffs / coeffs.norm(dim=1, keepdim=True) * torch.tensor(energies).sqrt().unsqueeze(1)
    return u0 @ coeffs, u0


def _gpse(a: torch.Tensor, clients: int, basis: torch.Tensor | None, eps: float, factor: int = 20):
    """Split the columns of ``a`` over clients, sketch each with its own generator, extend on the server."""
    payloads = {}
    for c, part in enumerate(a.chunk(clients, dim=1)):
        gen = torch.Generator().manual_seed(100 + c)
        blocks = [{"l": b} for b in part.split(7, dim=1)]  # chunked like a client's forward passes
        payloads[c] = client_sketch(blocks, {} if basis is None else {"l": basis}, {"l": factor * a.shape[0]},
                                    gen)["l"]
    return server_extend(payloads, basis, eps), payloads


def test_gpse_recovers_the_principal_subspace_independently_of_client_order():
    a, u0 = _low_rank(12, [100.0, 40.0, 20.0], 240)
    a = a + 1e-3 * torch.randn(a.shape, generator=torch.Generator().manual_seed(5))
    ext, payloads = _gpse(a, clients=4, basis=None, eps=0.99)
    assert ext.added == 3 and ext.residual_ratio == pytest.approx(1.0)
    cosines = torch.linalg.svdvals(u0.T @ ext.basis)  # cosines of the principal angles
    assert cosines.min() > 0.999
    reordered = server_extend(dict(reversed(list(payloads.items()))), None, 0.99)
    assert torch.equal(reordered.basis, ext.basis)


def test_threshold_picks_k_and_adds_nothing_once_the_basis_holds_eps():
    a, _ = _low_rank(10, [100.0, 25.0, 1.0], 90)  # energy shares .794 .198 .008
    first, _ = _gpse(a, clients=3, basis=None, eps=0.9)
    assert first.added == 2
    second, payloads = _gpse(a, clients=3, basis=first.basis, eps=0.9)
    assert second.residual_ratio == pytest.approx(1 / 126, rel=0.05)
    assert second.added == 0 and torch.equal(second.basis, first.basis)
    third = server_extend(payloads, first.basis, eps=0.999)  # (0.999 - 0.992) / 0.008 of the rest: one more
    assert third.added == 1
    assert server_extend(payloads, first.basis, eps=0.9, quirks=True).added == 1  # quirk: at least one


def test_residual_ratio_default_and_reference_quirk():
    assert residual_ratio([1.0, 3.0], [4.0, 4.0], quirks=False) == pytest.approx(0.5)
    assert residual_ratio([1.0, 4.0], [4.0, 16.0], quirks=True) == pytest.approx(0.5)  # mean of 1/2, 2/4


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, stride=2)
        self.head = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.head(torch.relu(self.conv(x)).flatten(1))


def _run_info(model: nn.Module, **kw) -> RunInfo:
    protected = {n: ("conv" if p.dim() == 4 else "linear") for n, p in model.named_parameters() if n.endswith("weight")}
    return RunInfo(num_tasks=2, scenario="domain", num_clients=3, clients_per_round=3, seed=0, model=model,
                   protected=protected, **kw)


def test_conv_outputs_on_old_task_patches_stay_unchanged_after_a_projected_update():
    torch.manual_seed(0)
    model = _ConvNet()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    base = torch.randn(12, 1, 8, 8)
    x_old = torch.cat([base, 2.0 * base], 1)  # channel 1 = 2 x channel 0: patches span 9 of 18 dims
    fot = FOT(FOTHyperparams(eps=0.99999, sketch_factor=5.0, conv_sketch_factor=5.0), _run_info(model))
    state = MethodState()
    payloads = {c: fot.client_end(ClientEndContext("task_end", model, params, ClientData(x, torch.zeros(len(x)), 0),
                                                   {}, {}, torch.Generator().manual_seed(c)))
                for c, x in enumerate(x_old.chunk(3))}
    fot.server_event(ServerEvent("task_end", state.server, 0, params, payloads))
    assert state.server["basis"]["conv.weight"].shape == (18, 9)
    delta = {k: torch.randn_like(v) for k, v in params.items()}
    projected = fot.transform_update(TransformUpdate(delta, state.server, task=1))
    assert torch.equal(projected["conv.bias"], delta["conv.bias"])
    assert projected["conv.weight"].norm() > 0.3 * delta["conv.weight"].norm()  # not simply zeroed
    before = F.conv2d(x_old, params["conv.weight"], stride=2, padding=1)
    after = F.conv2d(x_old, params["conv.weight"] + projected["conv.weight"], stride=2, padding=1)
    changed = F.conv2d(x_old, params["conv.weight"] + delta["conv.weight"], stride=2, padding=1)
    assert (after - before).norm() / (changed - before).norm() < 1e-4
    assert fot.transform_update(TransformUpdate(delta, {}, task=1)) is delta  # no basis yet (task 0): plain FedAvg
    # under a schedule a round whose clients are all on task 0 may follow another task's GPSE: projected too
    again = fot.transform_update(TransformUpdate(delta, state.server, 0))
    assert torch.equal(again["conv.weight"], projected["conv.weight"])


def test_gpse_clients_above_num_clients_is_a_config_error():
    with pytest.raises(ConfigError, match="gpse_clients"):
        FOT(FOTHyperparams(gpse_clients=4), _run_info(_ConvNet()))


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": {"name": "fot", "eps": 0.9, "sketch_factor": 2.0}}
    base.update(kw)
    return from_dict(base)


@pytest.mark.parametrize("scenario", ["task", "domain"])
def test_batched_equals_sequential(scenario):
    stream = make_stream(scenario, num_tasks=3)
    run_both_paths(_cfg, stream)


def test_run_counts_gpse_and_basis_traffic_and_reports_stats():
    stream = make_stream("task", num_tasks=3)
    cfg = _cfg(method={"name": "fot", "eps": 0.9, "sketch_factor": 2.0, "gpse_clients": 2})
    runner = Runner(cfg, stream)
    runner.run()
    stats = method_stats(runner.comm, runner.methods[0], runner.states[0])
    assert set(runner.run_info.protected) == {"body.1.weight", "body.3.weight"}  # per-task heads are not
    dims = {"body.1.weight": 12, "body.3.weight": 128}
    floats = sum(d * 2 * d + 2 for d in dims.values())
    assert stats["gpse_upload_floats_per_client"] == floats
    assert [t["upload_bytes_per_client"] for t in stats["tasks"]] == [4 * floats] * 2
    model_bytes, rounds = runner.model_bytes, 3 * cfg.rounds_per_task
    assert runner.comm.upload_bytes == rounds * 3 * model_bytes + 2 * 2 * 4 * floats
    basis_after_task0 = 4 * sum(d * stats["tasks"][0]["layers"][n]["k"] for n, d in dims.items())
    assert stats["tasks"][1]["basis_bytes_broadcast_per_client"] == basis_after_task0
    assert runner.comm.download_bytes == rounds * 3 * model_bytes + 2 * (2 * model_bytes + basis_after_task0)
    assert stats["basis_floats"] == sum(b.numel() for b in runner.states[0].server["basis"].values())
    for task in stats["tasks"]:
        for layer in task["layers"].values():
            assert 0 < layer["fraction"] <= 1
    k0 = stats["tasks"][0]["layers"]["body.1.weight"]["k"]
    assert stats["tasks"][1]["layers"]["body.1.weight"]["k"] >= k0


#: the FOT spec's sketch widths m / d per model and layer kind: m = d for the MLP and the small AlexNet
#: convs, m = 5d for the fully connected layers of AlexNet/ResNet and for ResNet convs
SPEC_FACTORS = {"mlp": {"linear": 1}, "digits-mlp": {"linear": 1}, "alexnet": {"linear": 5, "conv": 1},
                "resnet18-reduced": {"linear": 5, "conv": 5}, "resnet18-mini": {"linear": 5, "conv": 5},
                "resnet18-reduced-running-bn": {"linear": 5, "conv": 5}}


@pytest.mark.parametrize("model_name", sorted(any_method_models()))  # FOT cannot train FedWeIT's nets
def test_default_sketch_widths_follow_the_spec_per_model_and_layer_kind(model_name):
    assert model_name in SPEC_FACTORS, f"registered model '{model_name}' has no spec sketch width in this test"
    kinds = set()
    for multi_head in (True, False):  # a single shared head is protected, per-task heads are not
        model = build_model(model_name, ModelShape((3, 32, 32), 10, 2, multi_head))
        protected = protected_layers(model)
        info = RunInfo(num_tasks=2, scenario="task" if multi_head else "domain", num_clients=3,
                       clients_per_round=3, seed=0, model=model, protected=protected)
        widths = FOT(FOTHyperparams(), info).widths()
        shapes = dict(model.named_parameters())
        assert set(widths) == set(protected)
        for name, kind in protected.items():
            assert widths[name] == SPEC_FACTORS[model_name][kind] * shapes[name][0].numel(), name
        kinds |= set(protected.values())
    assert kinds == set(SPEC_FACTORS[model_name])  # every layer kind of the spec was checked


def test_explicit_sketch_factors_override_the_reference_and_unknown_models_must_set_them():
    model = _ConvNet()
    fot = FOT(FOTHyperparams(sketch_factor=2.0, conv_sketch_factor=3.0), _run_info(model))
    assert fot.widths() == {"conv.weight": 3 * 18, "head.weight": 2 * 48}
    with pytest.raises(ConfigError, match="conv_sketch_factor"):
        FOT(FOTHyperparams(sketch_factor=2.0), _run_info(model))


def test_eps_grows_by_eps_inc_after_each_task_and_stops_at_1():
    """ GPSE of task t uses ``min(1, eps + t * eps_inc)`` (the reference's +0.001 per task)."""
    hparams = FOTHyperparams(eps=0.998, eps_inc=0.001, sketch_factor=1.0, conv_sketch_factor=1.0)
    fot = FOT(hparams, _run_info(_ConvNet()))
    state = MethodState()
    for task in range(4):
        fot.server_event(ServerEvent("task_end", state.server, task, {}))
    assert [entry["eps"] for entry in state.server["log"]] == pytest.approx([0.998, 0.999, 1.0, 1.0], abs=1e-12)
    assert state.server["eps"] == 1.0
