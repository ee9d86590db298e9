"""RGO's maths (cfl/ops/rgo.py): recursion = closed form, trace d, old inputs kept as alpha -> 0, GPM's layout."""

import pytest
import torch
from torch import nn

from cfl.methods.gpm import extend_from_gram
from cfl.ops.layer_inputs import conv_patches, layer_inputs_or_grams
from cfl.ops.rgo import (
    absorb,
    absorb_columns,
    closed_form,
    fel_permutations,
    precondition,
    precondition_inputs,
    preconditioner,
    rls,
    rls_step,
    task_inputs,
    trace_normalised,
)
from cfl.ops.subspace import project_out
from tests.helpers import TwoLayerNet

DIAG = torch.diag(torch.tensor([4.0, 1.0, 0.0, 0.0], dtype=torch.float64))  # old inputs 2 e1 and e2


class RowConvNet(nn.Module):
    """A 3x3 conv without padding, then a linear head: images constant along each row give patches in 3 of 9 dims."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, bias=False)
        self.head = nn.Linear(2 * 3 * 3, 3)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.head(torch.relu(self.conv(x)).flatten(1))


def _row_images(n: int, seed: int = 0) -> torch.Tensor:
    rows = torch.randn(n, 1, 5, 1, generator=torch.Generator().manual_seed(seed))
    return rows.expand(n, 1, 5, 5).contiguous()


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _grams(model: nn.Module, x: torch.Tensor, protected: dict[str, str], gram: str) -> dict[str, torch.Tensor]:
    """``A A^T`` of :func:`task_inputs`, whether it holds ``A`` (fewer columns than d) or its Gram."""
    held = task_inputs(model, _params(model), x, 0, protected, gram)
    return {n: h.matrix if h.is_gram else h.matrix @ h.matrix.T for n, h in held.items()}


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_one_rls_step_by_hand():
    # x = (2, 0), alpha = 1: P x = (2, 0), x^T P x = 4, k = (2/5, 0), P = I - k x^T = diag(1/5, 1)
    p = rls_step(torch.eye(2, dtype=torch.float64), torch.tensor([2.0, 0.0], dtype=torch.float64), 1.0)
    assert torch.allclose(p, torch.diag(torch.tensor([0.2, 1.0], dtype=torch.float64)), atol=1e-15)


def test_preconditioner_of_a_diagonal_gram_by_hand():
    # alpha = 1: P = diag(1/5, 1/2, 1, 1), trace 2.7, P~ = 4 P / 2.7
    expected = torch.tensor([0.2, 0.5, 1.0, 1.0], dtype=torch.float64) * 4 / 2.7
    assert torch.allclose(preconditioner(DIAG, 1.0), torch.diag(expected), atol=1e-14)


def test_recursion_over_columns_equals_the_closed_form_and_the_task_end_update():
    gen = torch.Generator().manual_seed(0)
    a1, a2 = _randn(gen, 5, 7), _randn(gen, 5, 3)
    g1, g2 = a1 @ a1.T, a2 @ a2.T
    recursive = rls(torch.cat([a1, a2], 1), alpha=0.5)
    assert torch.allclose(recursive, closed_form(g1 + g2, 0.5), atol=1e-12)
    assert torch.allclose(trace_normalised(recursive), preconditioner(g1 + g2, 0.5), atol=1e-12)
    deflation = absorb(absorb(torch.zeros(5, 5), g1, 0.5), g2, 0.5)  # task by task, from D = I - P = 0
    assert torch.allclose(torch.eye(5, dtype=torch.float64) - deflation, recursive, atol=1e-12)
    thin = absorb_columns(absorb(torch.zeros(5, 5), g1, 0.5), a2, 0.5)  # task 2 from its 3 < 5 columns
    assert torch.allclose(thin, deflation, atol=1e-12)


def test_the_preconditioner_has_trace_d():
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(6, 4, generator=gen) * 10
    for alpha in (1e-3, 1.0, 100.0):
        assert torch.trace(preconditioner(a @ a.T, alpha)).item() == pytest.approx(6.0, rel=1e-12)


def test_a_steps_effect_on_old_inputs_shrinks_like_alpha():
    # P~ = 4 diag(a/(a+4), a/(a+1), 1, 1) / (a/(a+4) + a/(a+1) + 2): old inputs e1, e2 move by ~ a/2 and ~2a,
    # unused directions e3, e4 by ~2 (d / (d - 2))
    grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for alpha in (1e-2, 1e-3, 1e-4):
        stepped = precondition(grad, absorb(torch.zeros(4, 4), DIAG, alpha))
        p = torch.tensor([alpha / (alpha + 4), alpha / (alpha + 1), 1.0, 1.0], dtype=torch.float64)
        assert torch.allclose(stepped, grad * (4 * p / p.sum()), rtol=1e-9)
        ratios = stepped.norm(dim=0) / grad.norm(dim=0)
        assert ratios[0] == pytest.approx(alpha / 2, rel=3 * alpha)
        assert ratios[1] == pytest.approx(2 * alpha, rel=3 * alpha)
        assert ratios[2] == pytest.approx(2.0, rel=2 * alpha)


def test_interference_on_a_random_old_subspace_falls_tenfold_with_alpha():
    gen = torch.Generator().manual_seed(3)
    old = _randn(gen, 8, 3) @ _randn(gen, 3, 20)
    grad = _randn(gen, 5, 8)
    moved = [(precondition(grad, absorb(torch.zeros(8, 8), old @ old.T, a)) @ old).norm() / (grad @ old).norm()
             for a in (1e-2, 1e-3, 1e-4)]
    assert moved[0] < 1e-2 and moved[1] / moved[0] == pytest.approx(0.1, rel=0.02)
    assert moved[2] / moved[1] == pytest.approx(0.1, rel=0.002)


def test_linear_and_conv_gradients_on_their_in_view():
    gen = torch.Generator().manual_seed(4)
    a = _randn(gen, 9, 12)
    deflation, p_tilde = absorb(torch.zeros(9, 9), a @ a.T, 0.3), preconditioner(a @ a.T, 0.3)
    linear = _randn(gen, 4, 9)
    assert torch.allclose(precondition(linear, deflation), linear @ p_tilde, atol=1e-12)
    conv = _randn(gen, 2, 1, 3, 3)
    assert torch.allclose(precondition(conv, deflation), (conv.reshape(2, 9) @ p_tilde).reshape(2, 1, 3, 3), atol=1e-12)


def test_input_side_form_equals_the_gradient_side_for_a_linear_layer():
    gen = torch.Generator().manual_seed(5)
    a = _randn(gen, 6, 10)
    deflation = absorb(torch.zeros(6, 6), a @ a.T, 0.1)
    x, delta = _randn(gen, 4, 6), _randn(gen, 4, 3)
    assert torch.allclose(delta.T @ precondition_inputs(x, deflation), precondition(delta.T @ x, deflation), atol=1e-12)


def test_input_side_form_on_a_conv_layers_im2col_patches():
    torch.manual_seed(6)
    conv = nn.Conv2d(2, 3, 3, padding=1, stride=2, bias=False).double()
    x = torch.randn(4, 2, 6, 6, dtype=torch.float64)
    out = conv(x)
    upstream = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * upstream).sum(), [conv.weight])
    patches = conv_patches(conv, x)  # (18, B * L), sample-major, in the order of weight.view(C_out, -1)
    delta = upstream.permute(1, 0, 2, 3).reshape(3, -1)  # (C_out, B * L) in the same column order
    assert torch.allclose(grad.reshape(3, -1), delta @ patches.T, atol=1e-12)
    deflation = absorb(torch.zeros(18, 18), patches @ patches.T, 0.5)
    input_side = delta @ precondition_inputs(patches.T, deflation)
    assert torch.allclose(precondition(grad, deflation).reshape(3, -1), input_side, atol=1e-10)


def test_conv_grams_are_gpms_and_a_tiny_alpha_is_gpms_projection_scaled_by_d_over_free_dims():
    torch.manual_seed(7)
    model = RowConvNet()
    params, x, protected = _params(model), _row_images(10), {"conv.weight": "conv"}
    held = task_inputs(model, params, x, 0, protected)["conv.weight"]
    gpms = layer_inputs_or_grams(model, params, x, 0, protected)["conv.weight"]  # what GPM+FL collects
    assert held.is_gram and gpms.is_gram and torch.equal(held.matrix, gpms.matrix)
    gram = held.matrix
    assert torch.linalg.matrix_rank(gram).item() == 3
    basis = extend_from_gram(gram, None, eps=0.999999)  # GPM's basis of the same inputs: 3 directions
    assert basis.shape == (9, 3)
    grad = torch.randn(2, 1, 3, 3, dtype=torch.float64)
    rgo = precondition(grad, absorb(torch.zeros(9, 9), gram, 1e-6))
    assert torch.allclose(rgo, project_out(grad, basis.double()) * 9 / 6, atol=1e-6)


def test_mean_gram_divides_by_the_column_count_held_thin_or_as_a_gram():
    model, protected = TwoLayerNet(inputs=2), {"fc1.weight": "linear"}
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])  # 3 columns >= d = 2: held as the Gram
    sums = _grams(model, x, protected, "sum")["fc1.weight"]
    assert torch.equal(sums, torch.tensor([[2.0, 1.0], [1.0, 5.0]], dtype=torch.float64))
    assert torch.allclose(_grams(model, x, protected, "mean")["fc1.weight"], sums / 3)
    model, two = TwoLayerNet(inputs=3), torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]])  # 2 < d = 3: A / sqrt(2)
    assert not task_inputs(model, _params(model), two, 0, protected, "mean")["fc1.weight"].is_gram
    assert torch.allclose(_grams(model, two, protected, "mean")["fc1.weight"],
                          _grams(model, two, protected, "sum")["fc1.weight"] / 2)
    conv, images = RowConvNet(), _row_images(10)  # 10 images, 3 x 3 output positions each: 90 columns
    conv_sums = _grams(conv, images, {"conv.weight": "conv"}, "sum")["conv.weight"]
    assert torch.allclose(_grams(conv, images, {"conv.weight": "conv"}, "mean")["conv.weight"], conv_sums / 90)


def test_fel_permutations_depend_on_run_seed_and_task_only():
    widths = {"fc1.weight": 50, "fc2.weight": 30}
    first = fel_permutations(0, 1, widths)
    assert all(torch.equal(first[n], again) for n, again in fel_permutations(0, 1, widths).items())
    assert all(torch.equal(torch.sort(p).values, torch.arange(widths[n])) for n, p in first.items())
    assert not torch.equal(first["fc1.weight"], fel_permutations(0, 2, widths)["fc1.weight"])
    assert not torch.equal(first["fc1.weight"], fel_permutations(1, 1, widths)["fc1.weight"])
