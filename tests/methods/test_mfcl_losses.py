"""MFCL's losses on hand-computed inputs (ln 3 against 0 gives the softmax 3/4 : 1/4)."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.ops.mfcl_losses import (
    ClientTerms,
    MfclWeights,
    client_loss,
    content_cross_entropy,
    feature_distillation,
    gaussian_kernel,
    generator_objective,
    information_entropy_loss,
    smoothness_loss,
)

L3 = math.log(3)


def test_content_cross_entropy_divides_by_the_temperature_toward_the_argmax():
    """1000 ln 3 against 0 at T = 1000: CE toward class 0 = ln 4/3."""
    logits = torch.tensor([[1000 * L3, 0.0]], dtype=torch.float64)
    assert content_cross_entropy(logits).item() == pytest.approx(math.log(4 / 3), abs=1e-12)


def test_information_entropy_is_zero_for_an_even_batch_and_grows_as_it_collapses():
    """Mean softmax [1/2, 1/2]: 1 - ln 2 / ln 2 = 0; [3/4, 1/4]: 1 + (3/4 ln 3/4 + 1/4 ln 1/4) / ln 2."""
    even = torch.tensor([[L3, 0.0], [0.0, L3]], dtype=torch.float64)
    assert information_entropy_loss(even).item() == pytest.approx(0.0, abs=1e-12)
    one_sided = torch.tensor([[L3, 0.0], [L3, 0.0]], dtype=torch.float64)
    want = 1 + (0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert information_entropy_loss(one_sided).item() == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="at least 2 classes"):
        information_entropy_loss(torch.zeros(3, 1))


def test_the_kernel_follows_the_codes_formula_or_the_usual_one():
    """Code: 1-D weights exp(-(d/2)^2) = e^-1, e^-1/4, 1, ...; usual (sigma 1): e^-2, e^-1/2, 1, ...; the 2-D kernel
    is their normalised outer product."""
    code = 1 + 2 * math.exp(-0.25) + 2 * math.exp(-1)
    usual = 1 + 2 * math.exp(-0.5) + 2 * math.exp(-2)
    k = gaussian_kernel()
    assert k[2, 2].item() == pytest.approx(1 / code**2, abs=1e-12)
    assert k[0, 2].item() == pytest.approx(math.exp(-1) / code**2, abs=1e-12)
    assert gaussian_kernel(code_quirk=False)[2, 1].item() == pytest.approx(math.exp(-0.5) / usual**2, abs=1e-12)


def reflect(i: int, n: int) -> int:
    return -i if i < 0 else (2 * (n - 1) - i if i >= n else i)


def test_smoothness_is_the_mean_squared_gap_to_the_reflect_padded_blur():
    """A 5x5 image with a single 1 at the centre, blurred by hand (reflect padding: index -2 reads 2, 6 reads 2)."""
    image = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    image[0, 0, 2, 2] = 1.0
    k = gaussian_kernel()
    want = 0.0
    for i in range(5):
        for j in range(5):
            blur = sum(k[a + 2, b + 2].item() * image[0, 0, reflect(i + a, 5), reflect(j + b, 5)].item()
                       for a in range(-2, 3) for b in range(-2, 3))
            want += (image[0, 0, i, j].item() - blur) ** 2 / 25
    assert smoothness_loss(image, k).item() == pytest.approx(want, abs=1e-12)
    assert smoothness_loss(torch.full((2, 3, 6, 6), 0.3, dtype=torch.float64), k).item() == pytest.approx(0, abs=1e-12)


def test_generator_objective_weighs_its_four_parts():
    logits = torch.tensor([[1000 * L3, 0.0], [1000 * L3, 0.0]], dtype=torch.float64)  # ie: softmax ~ [1, 0] -> 1
    images = torch.full((2, 1, 5, 5), 0.5, dtype=torch.float64)
    parts = generator_objective(logits, torch.tensor(0.2, dtype=torch.float64), images, gaussian_kernel(),
                                MfclWeights())
    assert parts["ie"].item() == pytest.approx(1.0, abs=1e-12)
    assert parts["total"].item() == pytest.approx(math.log(4 / 3) + 1 + 50 * 0.2, abs=1e-12)


def test_feature_distillation_averages_the_old_heads_squared_gaps_over_old_classes():
    student = torch.tensor([[1.0, 2.0, 9.0]], dtype=torch.float64)
    teacher = torch.tensor([[0.0, 4.0, -5.0]], dtype=torch.float64)
    assert feature_distillation(student, teacher, torch.tensor([True, True, False])).item() == 2.5


def test_client_loss_on_a_real_a_synthetic_and_a_padded_sample():
    """Classes 0, 1 old, 2, 3 new. new: the real sample (y 2, new logits ln 3, 0): ln 4/3; the synthetic one (y 0)
    and the padded one are left out. ft over 4 seen classes: ln 4 (real, all 0) and ln 2 (synthetic, ln 3 on its
    class against three 0s): mean 1.5 ln 2. kd: (1 + 4) / 2 and (1 + 1) / 2: mean 1.75."""
    nan_free = 50.0  # the padded sample's values would change every mean
    terms = ClientTerms(
        logits=torch.tensor([[9.0, 9.0, L3, 0.0], [0.0, 0.0, 5.0, 0.0], [nan_free] * 4], dtype=torch.float64),
        frozen_feature_logits=torch.tensor([[0.0] * 4, [L3, 0.0, 0.0, 0.0], [nan_free] * 4], dtype=torch.float64),
        student_old_logits=torch.tensor([[1.0, 2.0, 0, 0], [0.0, 0.0, 0, 0], [nan_free] * 4], dtype=torch.float64),
        teacher_old_logits=torch.tensor([[0.0, 4.0, 0, 0], [1.0, 1.0, 0, 0], [0.0] * 4], dtype=torch.float64),
        y=torch.tensor([2, 0, 3]), real=torch.tensor([True, False, True]),
        weight=torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    old = torch.tensor([True, True, False, False])
    parts = client_loss(terms, ~old, torch.ones(4, dtype=torch.bool), old, w_ft=1.0, w_kd=0.1)
    assert parts["new"].item() == pytest.approx(math.log(4 / 3), abs=1e-12)
    assert parts["ft"].item() == pytest.approx(1.5 * math.log(2), abs=1e-12)
    assert parts["kd"].item() == pytest.approx(1.75, abs=1e-12)
    assert parts["total"].item() == pytest.approx(math.log(4 / 3) + 1.5 * math.log(2) + 0.175, abs=1e-12)


def test_client_loss_gradient_stays_finite_where_a_label_is_outside_the_new_classes():
    """The synthetic sample's new-class CE is infinite (its label's column is masked) and must be left out cleanly."""
    logits = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    other = torch.zeros(2, 4, dtype=torch.float64)
    terms = ClientTerms(logits, other, other, other, torch.tensor([2, 0]), torch.tensor([True, False]),
                        torch.ones(2, dtype=torch.float64))
    old = torch.tensor([True, True, False, False])
    client_loss(terms, ~old, torch.ones(4, dtype=torch.bool), old)["total"].backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[1].abs().sum() == 0


def test_the_new_class_cross_entropy_leaves_out_a_real_old_class_sample():
    """A real sample of old class 0 (its label outside the new columns) beside a real new-class one (y 2, new
    logits ln 3, 0: ln 4/3): ``new`` is the mean over real samples of a new class only, ln 4/3."""
    logits = torch.tensor([[0.0, 0.0, 1.0, 2.0], [9.0, 9.0, L3, 0.0]], dtype=torch.float64)
    other = torch.zeros(2, 4, dtype=torch.float64)
    terms = ClientTerms(logits, other, other, other, torch.tensor([0, 2]), torch.tensor([True, True]),
                        torch.ones(2, dtype=torch.float64))
    old = torch.tensor([True, True, False, False])
    parts = client_loss(terms, ~old, torch.ones(4, dtype=torch.bool), old)
    assert parts["new"].item() == pytest.approx(math.log(4 / 3), abs=1e-12)
