"""precision: bf16-mixed (cfl/engine/precision.py): the config key, autocast, the bfloat16-units check and the
stacked path's float32 step from a bfloat16 product."""

from __future__ import annotations

import warnings

import pytest
import torch

from cfl.engine import precision
from cfl.engine.precision import Bf16Weights, autocast, cpu_flags, parse_precision, warn_if_slow
from cfl.schema import ConfigError
from cfl.validation import from_dict


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
    """On CUDA no probe runs: torch.cuda.is_bf16_supported() decides (a CPU's rates: tests/test_bf16_probe.py)."""
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
