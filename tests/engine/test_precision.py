"""precision: bf16-mixed (cfl/engine/local/precision.py): the config key, autocast, the bfloat16-units check and the
stacked path's float32 step from a bfloat16 product."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cfl.config.precision import parse_precision
from cfl.config.schema import ConfigError
from cfl.engine.local import precision
from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.path import choose_path
from cfl.engine.local.precision import Bf16Weights, autocast, cpu_flags, warn_if_slow
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.stacked_net import StackedNet
from cfl.methods.fedavg import FedAvg
from cfl.models import ModelShape, build_model
from cfl.models.buffers import keeps_running_stats, running_stats
from cfl.records.client_states import MethodState
from cfl.validation import from_dict
from tests.conftest import any_method_models


@pytest.mark.parametrize(("given", "stored"), [(None, 32), (32, 32), ("32", 32), ("bf16-mixed", "bf16-mixed")])
def test_precision_key_takes_32_or_bf16_mixed(given, stored):
    cfg = from_dict({} if given is None else {"precision": given})
    assert cfg.precision == stored


@pytest.mark.parametrize("bad", ["bf16", 16, 32.0, "16-mixed", True])
def test_other_precisions_are_refused_naming_the_allowed_ones(bad):
    with pytest.raises(ConfigError, match="precision"):
        from_dict({"precision": bad})
    with pytest.raises(ConfigError, match="32 .* or bf16-mixed"):
        parse_precision(bad)


def test_autocast_runs_products_in_bfloat16_only_in_bf16_mixed():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with autocast("bf16-mixed", torch.device("cpu")):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(32, torch.device("cpu")):
        assert (a @ b).dtype == torch.float32


def test_cpu_flags_read_x86_and_arm_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert {"avx512_bf16", "avx512f", "fpu"} <= cpu_flags(x86)
    assert "bf16" in cpu_flags(arm)
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize(("units", "warns"), [(False, True), (True, False)])
def test_bf16_mixed_on_a_gpu_without_bfloat16_units_warns_once(monkeypatch, units, warns):
    """On CUDA no probe runs: torch.cuda.is_bf16_supported() decides (a CPU's rates:
    tests/engine/test_bf16_probe.py)."""
    monkeypatch.setattr(precision, "_warned", set())
    monkeypatch.setattr(precision, "_units", lambda _: units)
    monkeypatch.setattr(precision.bf16_probe, "probed_rates", lambda: pytest.fail("probed on CUDA"))
    cuda = torch.device("cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_slow(32, cuda)
        warn_if_slow("bf16-mixed", cuda)
        warn_if_slow("bf16-mixed", cuda)
    slow = [w for w in caught if "slower than with precision: 32" in str(w.message)]
    assert len(slow) == (1 if warns else 0)


@pytest.mark.parametrize("decay", [1.0, 0.99, 1.0 - 1e-9])
def test_float32_step_from_a_bfloat16_product(decay):
    """``w <- decay * w + alpha * a @ b``: the product of the bfloat16 operands (exact in float64), rounded
    once to bfloat16, then added to the float32 weights, which stay float32."""
    torch.manual_seed(0)
    w = torch.randn(2, 5, 7)
    a, b = torch.randn(2, 5, 3).bfloat16(), torch.randn(2, 3, 7).bfloat16()
    expected = decay * w.double() + (-0.1 * (a.double() @ b.double())).bfloat16().double()
    workspace: dict = {}
    Bf16Weights(workspace).step("layer", w, a, b, decay, -0.1)
    assert w.dtype == torch.float32
    assert torch.allclose(w.double(), expected, rtol=0, atol=4e-3 * 0.1 * float((a.double() @ b.double()).abs().max()))
    keys = set(workspace)
    Bf16Weights(workspace).step("layer", w[:1], a[:1], b[:1], decay, -0.1)  # fewer clients: a prefix of the buffers
    assert set(workspace) == keys


def test_cast_copies_into_a_kept_buffer():
    workspace: dict = {}
    low = Bf16Weights(workspace)
    w = torch.randn(3, 4, 5)
    first = low.cast("fc", w)
    assert first.dtype == torch.bfloat16 and torch.equal(first, w.bfloat16())
    again = low.cast("fc", w * 2)
    assert again.data_ptr() == first.data_ptr() and torch.equal(again, (w * 2).bfloat16())


# ---- which precision the products of local training run in, per model and path ---------------------------------

#: aten's products: convolutions and matrix products, forward and backward
PRODUCTS = frozenset({"convolution", "convolution_backward", "_convolution", "mm", "bmm", "addmm", "baddbmm",
                      "addbmm", "mv", "addmv", "dot"})


class ProductDtypes(TorchDispatchMode):
    """Counts the products torch runs, by operator and the dtypes of their floating-point operands."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[tuple[str, tuple[str, ...]]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        if name in PRODUCTS:
            tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            self.counts[name, tuple(sorted({str(t.dtype) for t in tensors if t.is_floating_point()}))] += 1
        return func(*args, **(kwargs or {}))


#: an input every registered model takes (tests/test_batched_equals_sequential.smallest_image: 20x20 at most)
SMALL_IMAGE = (3, 20, 20)


def _paths(name: str) -> list[str]:
    model = build_model(name, ModelShape(SMALL_IMAGE, 3, 2, True))
    vmap = [] if keeps_running_stats(model) else ["vmap"]  # bf16-mixed with running statistics: sequential
    return (["stacked"] if StackedNet.model_refusal(model) is None else []) + vmap + ["sequential"]


def test_bf16_mixed_on_a_model_with_running_statistics_trains_sequentially_and_says_why():
    model = build_model("resnet18-reduced-running-bn", ModelShape(SMALL_IMAGE, 3, 2, True))
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2,
               precision="bf16-mixed")
    chosen = choose_path(model, hp, [FedAvg(None, None)])
    assert chosen.path == "sequential" and "bfloat16 inputs beside float32 running statistics" in chosen.reason
    assert choose_path(model, replace(hp, precision=32), [FedAvg(None, None)]).path == "vmap"


def _products_of_a_step(name: str, path: str, precision_: int | str) -> Counter:
    """The products of one local step of two clients (4 samples each, batch 4) of model ``name`` on ``path``."""
    torch.manual_seed(0)
    model = build_model(name, ModelShape(SMALL_IMAGE, 3, 2, True))
    x, y = torch.randn(8, *SMALL_IMAGE), torch.arange(8) % 3
    stats = running_stats(model)  # a model with BatchNorm running statistics: each client starts from them
    jobs = [ClientJob(0, torch.arange(4), None, 1, buffers=stats), ClientJob(1, torch.arange(4, 8), None, 2,
                                                                             buffers=stats)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2,
               path="" if path == "sequential" else path, precision=precision_)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    trainer = train_sequential if path == "sequential" else train_batched
    with ProductDtypes() as seen:
        trainer(model, start, jobs, x, y, 1, hp, round_methods)
    return seen.counts


@pytest.mark.parametrize(("name", "path"), [(name, path) for name in any_method_models()
                                            for path in _paths(name)])
def test_bf16_mixed_runs_every_product_of_local_training_in_bfloat16_on_every_path(name, path, monkeypatch):
    """Forward and backward, convolutions included: under ``vmap`` torch's autocast does not reach a
    convolution (once 80 of the 86 products of a resnet18-reduced step ran in float32 there). The stacked
    path's compiled master-weight step is replaced by its eager passes (no products either way)."""
    monkeypatch.setattr(precision, "step_cast", lambda *_: False)
    monkeypatch.setattr(precision, "_warned", {"cpu"})  # the speed probe's float32 products are not training's
    counts = _products_of_a_step(name, path, "bf16-mixed")
    float32 = {op: n for op, n in counts.items() if op[1] != ("torch.bfloat16",)}
    assert counts and not float32, float32
    has_conv = any(isinstance(m, torch.nn.Conv2d) for m in build_model(name, ModelShape(SMALL_IMAGE, 3, 2, True))
                   .modules())
    assert has_conv == any(op.startswith("convolution") for op, _ in counts)


def test_the_product_count_sees_float32_products():
    counts = _products_of_a_step("resnet18-reduced", "vmap", 32)
    assert counts and all(dtypes == ("torch.float32",) for _, dtypes in counts)
    assert counts["convolution", ("torch.float32",)] > 0
