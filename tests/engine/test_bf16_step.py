"""bf16-mixed's fused step (cfl/engine/local/bf16_step.py): one compiled pass steps the float32 weight and writes its
bfloat16 copy, equal to the eager passes to float32 rounding; where it cannot be compiled, the eager passes and
one warning."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from cfl.engine.local import bf16_step
from cfl.engine.local.precision import Bf16Weights


def _operands(clients: int, seed: int, rows: int = 6, cols: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(clients, rows, cols, generator=g)
    a = torch.randn(clients, rows, 5, generator=g).bfloat16()
    b = torch.randn(clients, 5, cols, generator=g).bfloat16()
    return w, a, b


def _eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager passes from here on, as where the pass cannot be compiled (no warning: it is not compiled)."""
    monkeypatch.setattr(bf16_step, "_kernels", {"cpu": None})


@pytest.mark.parametrize("decay", [1.0, 0.99, 1.0 - 1e-9])
def test_fused_step_equals_the_eager_step_and_writes_the_bfloat16_copy(monkeypatch, decay):
    """Three clients, then a prefix of two (the buffers stay sized for three): the fused weights equal the eager
    ones to float32 rounding of the terms, and the copy the step leaves is the weights rounded to bfloat16."""
    fused_ws: dict = {}
    eager_ws: dict = {}
    fused, eager = [], []
    for clients, seed in [(3, 0), (2, 1)]:
        w, a, b = _operands(clients, seed)
        w_eager = w.clone()
        Bf16Weights(fused_ws).step("fc", w, a, b, decay, -0.1)
        assert bf16_step._kernels["cpu"] is not None  # the default path is the compiled one
        with monkeypatch.context() as m:
            _eager(m)
            Bf16Weights(eager_ws).step("fc", w_eager, a, b, decay, -0.1)
        fused.append(w)
        eager.append(w_eager)
        assert torch.equal(fused_ws["bf16:fc"][:clients], w.to(torch.bfloat16))
    assert fused_ws["bf16:fc"].shape[0] == 3
    for w, w_eager, (clients, seed) in zip(fused, eager, [(3, 0), (2, 1)], strict=True):
        start, a, b = _operands(clients, seed)
        terms = decay * start.abs() + 0.1 * (a.double() @ b.double()).abs().float() * 1.01
        assert w.dtype == torch.float32
        assert torch.all((w - w_eager).abs() <= 4 * torch.finfo(torch.float32).eps * terms)


def test_cast_after_a_step_returns_its_copy_and_copies_after_any_change():
    workspace: dict = {}
    low = Bf16Weights(workspace)
    w, a, b = _operands(3, 2)
    assert torch.equal(low.cast("fc", w), w.bfloat16())  # no step yet: copied
    low.step("fc", w, a, b, 0.99, -0.1)
    buf = workspace["bf16:fc"]
    version = buf._version
    assert torch.equal(low.cast("fc", w), w.bfloat16()) and buf._version == version  # the step's copy, not re-read
    assert torch.equal(low.cast("fc", w[:2]), w[:2].bfloat16()) and buf._version == version  # a prefix too
    w.mul_(2)  # changed outside the step (a new round's weights): copied again
    assert torch.equal(low.cast("fc", w), w.bfloat16()) and buf._version > version
    other = w.clone()  # another tensor of equal values: copied from it
    assert torch.equal(low.cast("fc", other), other.bfloat16())
    low.step("fc", w, a, b, 0.99, -0.1)
    assert torch.equal(Bf16Weights(workspace).cast("fc", w), w.bfloat16())  # a new round's Bf16Weights copies


def test_one_compilation_serves_every_shape_and_scalar():
    w, a, b = _operands(3, 3)
    Bf16Weights({}).step("fc", w, a, b, 0.99, -0.1)  # compiled here at the latest
    graphs = counters["stats"]["unique_graphs"]
    for clients, decay, alpha in [(5, 1.0, -0.2), (2, 0.9, -0.05), (7, 0.999, -1.0)]:
        w, a, b = _operands(clients, clients, rows=clients + 1, cols=2 * clients)
        Bf16Weights({}).step("fc", w, a, b, decay, alpha)
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("how", ["raises", "wrong", "disabled"])
def test_without_a_compiled_pass_the_eager_step_runs_and_says_so_once(monkeypatch, how):
    """torch.compile raising (no C++ compiler, say: the wrapped error's first line is named), a compiled pass
    that fails the check on first use, or torch.compile disabled (it would run the pass eagerly, unvectorised)."""
    def broken(fn, **kwargs):  # noqa: ANN001, ANN003, ARG001
        if how == "raises":
            try:
                raise RuntimeError("no working C++ compiler found\nmore lines")
            except RuntimeError as e:
                raise ValueError("backend='inductor' raised:") from e
        return lambda *_: None  # writes nothing: the check's step differs
    monkeypatch.setattr(bf16_step, "_kernels", {})
    monkeypatch.setattr(torch, "compile", broken)
    w, a, b = _operands(2, 4)
    expected = w.clone()
    with monkeypatch.context() as m:
        _eager(m)
        Bf16Weights({}).step("fc", expected, a, b, 0.99, -0.1)
    with warnings.catch_warnings(record=True) as caught, torch._dynamo.config.patch(disable=how == "disabled"):
        warnings.simplefilter("always")
        Bf16Weights({}).step("fc", w, a, b, 0.99, -0.1)
        Bf16Weights({}).step("fc", w.clone(), a, b, 0.99, -0.1)
    lines = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(lines) == 1 and "could not be compiled" in lines[0] and "eager passes" in lines[0]
    assert ("ValueError: backend='inductor' raised (RuntimeError: no working C++ compiler found)" in lines[0]) \
        == (how == "raises")
    assert ("torch.compile is disabled" in lines[0]) == (how == "disabled")
    assert "more lines" not in lines[0]
    assert torch.equal(w, expected)
