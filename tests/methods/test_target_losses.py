"""TARGET's losses on hand-computed logits whose softmaxes are exact fractions (ln 3 against 0 gives 3/4 : 1/4,
ln 2 gives 2/3 : 1/3)."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.ops.target_losses import (
    TargetWeights,
    adversarial_term,
    generator_objective,
    new_class_cross_entropy,
    old_class_distillation,
    student_distillation,
)

L2, L3 = math.log(2), math.log(3)
TEACHER = torch.tensor([[L3, 0.0], [0.0, L3]], dtype=torch.float64)  # p = [3/4, 1/4], [1/4, 3/4]; argmax 0, 1
STUDENT = torch.tensor([[L2, 0.0], [L3, 0.0]], dtype=torch.float64)  # q = [2/3, 1/3], [3/4, 1/4]; argmax 0, 0
KL0 = 0.75 * math.log(0.75 / (2 / 3)) + 0.25 * math.log(0.25 / (1 / 3))  # sample 0: KL(p || q)


def test_adversarial_term_counts_only_agreeing_samples_over_the_whole_batch():
    """Sample 1 disagrees (argmax 1 vs 0): it counts 0, yet the mean divides by 2."""
    assert adversarial_term(STUDENT, TEACHER).item() == pytest.approx(-KL0 / 2, abs=1e-12)


def test_generator_objective_weighs_its_three_parts():
    """bn 10 x 2; oh 0.5 x CE toward labels [0, 0] = (ln 4/3 + ln 4) / 2; adv 1 x (-KL0 / 2)."""
    bn = torch.tensor(2.0, dtype=torch.float64)
    targets = torch.tensor([0, 0])
    ce = (math.log(4 / 3) + math.log(4)) / 2
    parts = generator_objective(bn, TEACHER, targets, STUDENT, TargetWeights(bn=10, oh=0.5, adv=1))
    assert parts["ce"].item() == pytest.approx(ce, abs=1e-12)
    assert parts["total"].item() == pytest.approx(20 + 0.5 * ce - KL0 / 2, abs=1e-12)
    without = generator_objective(bn, TEACHER, targets, None, TargetWeights())
    assert without["adv"].item() == 0 and without["total"].item() == pytest.approx(20 + 0.5 * ce, abs=1e-12)


def test_student_distillation_scales_the_tempered_kl_by_t_squared():
    """At T = 2 the logits 2 ln 3 and 2 ln 2 give back the fractions above: 4 x mean(KL0, KL0)."""
    got = student_distillation(2 * STUDENT[:1].repeat(2, 1), 2 * TEACHER[:1].repeat(2, 1), temperature=2.0)
    assert got.item() == pytest.approx(4 * KL0, abs=1e-12)


def test_new_class_cross_entropy_runs_its_softmax_over_the_new_classes_only():
    """Class 0 old (logit 5 ignored); classes 1, 2 new with logits ln 3, 0: -ln 3/4."""
    logits = torch.tensor([[5.0, L3, 0.0]], dtype=torch.float64)
    got = new_class_cross_entropy(logits, torch.tensor([1]), torch.tensor([False, True, True]))
    assert got.item() == pytest.approx(math.log(4 / 3), abs=1e-12)


def test_old_class_distillation_is_the_tempered_soft_cross_entropy_over_old_classes():
    """Old classes 0, 1 at T = 2: teacher [0, 0] -> [1/2, 1/2]; student [2 ln 3, 0] -> [3/4, 1/4]; column 2 (new)
    ignored: -(ln 3/4 + ln 1/4) / 2; the teacher and the new column get no gradient."""
    old = torch.tensor([True, True, False])
    student = torch.tensor([[2 * L3, 0.0, 9.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[0.0, 0.0, -7.0]], dtype=torch.float64, requires_grad=True)
    got = old_class_distillation(student, teacher, old, temperature=2.0)
    assert got.item() == pytest.approx((math.log(4 / 3) + math.log(4)) / 2, abs=1e-12)
    got.sum().backward()
    assert teacher.grad is None and student.grad[0, 2] == 0
    torch.testing.assert_close(student.grad[0, :2], torch.tensor([0.125, -0.125], dtype=torch.float64))
