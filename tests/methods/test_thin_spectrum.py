"""GPM's thin path (n < d columns: SVD of the residual) keeps the same subspace as its d x d Gram path."""

import pytest
import torch

from cfl.methods.base import ClientData, RunInfo
from cfl.methods.gpm import GPM, GPMHyperparams, extend_from_gram, extend_from_held, extend_from_inputs
from cfl.methods.training_hooks import ClientEndContext
from cfl.ops.layer_inputs import HeldInputs, layer_grams, layer_inputs_or_grams
from cfl.ops.subspace import gram_residual_spectrum, thin_residual_spectrum
from tests.helpers import TwoLayerNet


def _projector(basis: torch.Tensor) -> torch.Tensor:
    basis = basis.double()
    return basis @ basis.T


def _same_span(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(_projector(a), _projector(b), atol=1e-5)


def _inputs(d: int, n: int, rank: int, seed: int = 0) -> torch.Tensor:
    """``d x n`` inputs of rank ``rank`` with well separated singular values 2^-j."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(d, rank, generator=gen, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(n, rank, generator=gen, dtype=torch.float64))[0]
    return u @ torch.diag(2.0 ** -torch.arange(rank, dtype=torch.float64)) @ v.T


def test_hand_checkable_inputs_give_the_same_bases_on_both_paths():
    a = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])  # energies 9 and 1: shares 0.9, 0.1
    e1, e2 = torch.eye(4)[:, :1], torch.eye(4)[:, 1:2]
    thin = extend_from_inputs(a, None, eps=0.85)
    assert thin.shape == (4, 1) and _same_span(thin, e1) and _same_span(thin, extend_from_gram(a @ a.T, None, 0.85))
    both = extend_from_inputs(a, None, eps=0.95)
    assert _same_span(both, torch.eye(4)[:, :2]) and _same_span(both, extend_from_gram(a @ a.T, None, 0.95))
    # basis e1 holds 0.9; eps 0.95 needs (0.95 - 0.9) / 0.1 = half of the residual e2: one more column
    grown = extend_from_inputs(a, e1, eps=0.95)
    assert grown.shape == (4, 2) and torch.allclose(grown[:, :1], e1) and _same_span(grown[:, 1:], e2)
    assert extend_from_inputs(a, e1, eps=0.9).shape == (4, 1)  # the basis already holds eps
    assert torch.equal(extend_from_inputs(a, torch.eye(4)[:, :2], eps=1.0), torch.eye(4)[:, :2])  # R = 0


@pytest.mark.parametrize(("d", "n", "rank"), [(12, 5, 5), (12, 11, 11), (12, 8, 3)])
@pytest.mark.parametrize("eps", [0.7, 0.95, 0.999])
def test_thin_and_gram_paths_agree_with_and_without_a_basis(d, n, rank, eps):
    a = _inputs(d, n, rank)
    first = extend_from_inputs(a, None, eps)
    assert _same_span(first, extend_from_gram(a @ a.T, None, eps))
    b = _inputs(d, n, rank, seed=1) + 0.5 * a  # a later task: partly inside the old basis
    thin, gram = extend_from_inputs(b, first, eps), extend_from_gram(b @ b.T, first, eps)
    assert _same_span(thin, gram) and torch.equal(thin[:, : first.shape[1]], first)


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e7])
def test_the_noise_cut_off_is_relative_to_the_top_singular_value(scale):
    """ Directions with ``S_j <= 1e-6 S_1`` are noise whatever the inputs' scale. Rank-3
    inputs keep exactly 3 directions at every scale; an absolute cut (``S_j > 1e-6``) keeps none at 1e-9
    and rounding noise at 1e7 (eigh's error on ``R^T R`` there is ~1e-16 * 1e14: singular values ~0.1)."""
    a = _inputs(10, 6, 3) * scale
    vectors, svals, ratio = thin_residual_spectrum(a, None)
    assert vectors.shape == (10, 3) and ratio == pytest.approx(1.0)
    assert torch.allclose(svals / scale, torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64), rtol=1e-9)
    assert _same_span(vectors, thin_residual_spectrum(_inputs(10, 6, 3), None)[0])


def test_residual_spectrum_and_ratio_match_the_gram_path():
    a = _inputs(10, 6, 6)
    basis = torch.linalg.qr(torch.randn(10, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64))[0]
    u_thin, s_thin, r_thin = thin_residual_spectrum(a, basis)
    u_gram, s_gram, r_gram = gram_residual_spectrum(a @ a.T, basis)
    assert r_thin == pytest.approx(r_gram, rel=1e-10) and 0 < r_thin < 1
    assert u_thin.shape == (10, 6) and torch.allclose(s_thin, s_gram[:6], atol=1e-7)
    assert float(s_gram[6:].abs().max()) < 1e-6  # the Gram path's extra directions hold nothing
    assert torch.allclose(_projector(u_thin), _projector(u_gram[:, :6]), atol=1e-6)


def test_duplicate_samples_add_no_directions_on_either_path():
    a = _inputs(9, 3, 3)
    dup = torch.cat([a, a, a[:, :1]], 1)  # 7 columns < 9, rank 3
    for eps in (0.9, 1.0):
        thin = extend_from_inputs(dup, None, eps)
        assert _same_span(thin, extend_from_gram(dup @ dup.T, None, eps))
    assert extend_from_inputs(dup, None, 1.0).shape == (9, 3)



def test_inputs_are_held_thin_below_d_and_as_the_gram_from_d_on():
    torch.manual_seed(0)
    net = TwoLayerNet(hidden=20)  # fc1: d = 8, fc2: d = 20; with 10 samples fc1 has n >= d, fc2 n < d
    params = dict(net.named_parameters())
    protected = {"fc1.weight": "linear", "fc2.weight": "linear"}
    x = torch.randn(10, 8)
    held = layer_inputs_or_grams(net, params, x, 0, protected, chunk=3)  # fc1 turns into a Gram at 9 columns
    grams = layer_grams(net, params, x, 0, protected, chunk=3)
    assert held["fc1.weight"].is_gram and torch.allclose(held["fc1.weight"].matrix, grams["fc1.weight"])
    fc2 = held["fc2.weight"]
    assert not fc2.is_gram and fc2.matrix.shape == (20, 10)
    assert torch.allclose(fc2.matrix @ fc2.matrix.T, grams["fc2.weight"])
    assert HeldInputs.of(torch.ones(4, 4)).is_gram and not HeldInputs.of(torch.ones(4, 3)).is_gram


def test_client_end_keeps_the_bases_of_the_gram_path_on_both_branches():
    torch.manual_seed(0)
    net = TwoLayerNet(hidden=20)
    params = {k: v.detach() for k, v in net.named_parameters()}
    protected = {"fc1.weight": "linear", "fc2.weight": "linear"}
    info = RunInfo(num_tasks=2, scenario="domain", num_clients=1, clients_per_round=1, seed=0, model=net,
                   protected=protected)
    gpm = GPM(GPMHyperparams(eps=0.97, chunk=4), info)
    state: dict = {}
    expected: dict = {}
    for task in range(2):
        x = torch.randn(10, 8)
        gpm.client_end(ClientEndContext("task_end", net, params, ClientData(x, torch.zeros(10), task), state, {},
                                        torch.Generator()))
        for name, gram in layer_grams(net, params, x, task, protected).items():
            expected[name] = extend_from_gram(gram, expected.get(name), 0.97)
        for name, basis in state["bases"].items():
            assert _same_span(basis, expected[name]), name
    held = layer_inputs_or_grams(net, params, torch.randn(10, 8), 0, protected)
    assert {n: h.is_gram for n, h in held.items()} == {"fc1.weight": True, "fc2.weight": False}
    assert extend_from_held(held["fc2.weight"], None, 0.97).shape[1] <= 10
