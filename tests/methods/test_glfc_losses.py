"""GLFC's two losses on hand-computed batches, in the official code's form and the paper's.

The batch: 4 classes, 0..2 seen (column 3 unseen: never counted), class 0 old; one sample per class 0, 1, 2 with
logits whose sigmoids / softmaxes are exact fractions (ln 3 gives sigmoid 3/4)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import vmap

from cfl.ops.glfc_losses import glfc_loss, glfc_loss_by_task, gradient_compensation, relation_distillation

L2, L3 = math.log(2), math.log(3)
LOGITS = torch.tensor([[L3, 0.0, 0.0, 5.0], [0.0, L3, 0.0, -4.0], [0.0, 0.0, -L3, 9.0]], dtype=torch.float64)
Y = torch.tensor([0, 1, 2])
REAL = torch.ones(3, dtype=torch.float64)
SEEN = torch.tensor([True, True, True, False])
OLD = torch.tensor([True, False, False, False])
NONE_OLD = torch.zeros(4, dtype=torch.bool)
# the old model: sigmoid(0) = 1/2 on the old class for sample 0, sigmoid(-ln 3) = 1/4 for 1 and 2; the 9s sit on
# columns that are not old, which the target never reads
OLD_LOGITS = torch.tensor([[0.0, 9, 9, 9], [-L3, 9, 9, 9], [-L3, 9, 9, 9]], dtype=torch.float64)

# code form, the loss each sample's weight multiplies: mean over 3 seen columns of BCE(z, onehot)
# (BCE(0, t) = ln 2 for any t; BCE(ln 3, 1) = ln 4/3; BCE(-ln 3, 1) = ln 4)
CODE_BASE = [(math.log(4 / 3) + 2 * L2) / 3, (math.log(4 / 3) + 2 * L2) / 3, (2 * L2 + 2 * L2) / 3]
# g = |sigmoid(z_y) - 1| = 1/4, 1/4, 3/4; old group {0}: w0 = 1; new group {1, 2}, mean 1/2: w1 = 1/2, w2 = 3/2
CODE_W = [1.0, 0.5, 1.5]


def close(got: torch.Tensor, want: list[float]) -> None:
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_code_form_weights_each_group_by_its_mean_gradient():
    close(gradient_compensation(LOGITS, Y, REAL, SEEN, OLD), [w * b for w, b in zip(CODE_W, CODE_BASE, strict=True)])


def test_code_form_first_task_weighs_every_sample_one():
    close(gradient_compensation(LOGITS, Y, REAL, SEEN, NONE_OLD), CODE_BASE)


def test_padding_is_left_out_of_the_group_means():
    """A padded fourth sample of the new group (weight 0, g = 3/4) would make the new-group mean 7/12."""
    logits = torch.cat([LOGITS, torch.tensor([[0.0, -L3, 0.0, 0.0]], dtype=torch.float64)])
    got = gradient_compensation(logits, torch.tensor([0, 1, 2, 1]), torch.tensor([1.0, 1, 1, 0], dtype=torch.float64),
                                SEEN, OLD)
    close(got[:3], [w * b for w, b in zip(CODE_W, CODE_BASE, strict=True)])


def test_an_empty_group_does_not_divide_by_zero():
    """No old-class sample in the batch (class 0 old, labels 1 and 2): the new group alone, mean (1/4 + 3/4) / 2."""
    got = gradient_compensation(LOGITS[1:], Y[1:], REAL[1:], SEEN, OLD)
    close(got, [0.5 * CODE_BASE[1], 1.5 * CODE_BASE[2]])


def test_the_weights_carry_no_gradient():
    """d L_GC / d z of sample 2 is w2 (sigmoid(z) - onehot) / 3 on the seen columns: the weight is a constant."""
    logits = LOGITS.clone().requires_grad_()
    gradient_compensation(logits, Y, REAL, SEEN, OLD)[2].backward()
    torch.testing.assert_close(logits.grad[2], 1.5 * torch.tensor([0.5, 0.5, 0.25 - 1, 0], dtype=torch.float64) / 3)
    assert logits.grad[:2].abs().max() == 0


def test_paper_form_uses_the_softmax_and_cross_entropy():
    """softmax over the seen classes: p_y = 3/5, 3/5, 1/7; g = 2/5, 2/5, 6/7; new-group mean 22/35:
    w = 1, 7/11, 15/11; CE = ln 5/3, ln 5/3, ln 7."""
    close(gradient_compensation(LOGITS, Y, REAL, SEEN, OLD, form="paper"),
          [math.log(5 / 3), 7 / 11 * math.log(5 / 3), 15 / 11 * math.log(7)])


def test_code_form_distillation_replaces_the_old_entries_by_the_old_sigmoid():
    """targets: [1/2, 0, 0], [1/4, 1, 0], [1/4, 0, 1]; BCE(z, t) = softplus(z) - t z, mean over the 3 seen columns."""
    want = [(math.log(4) - L3 / 2 + 2 * L2) / 3, (L2 + math.log(4 / 3) + L2) / 3, (L2 + L2 + math.log(4)) / 3]
    close(relation_distillation(LOGITS, Y, OLD_LOGITS, SEEN, OLD), want)


def test_paper_form_distillation_is_a_kl_to_the_normalised_target():
    """Old classes 0 and 1 (old softmax of [ln 3, 0] = [3/4, 1/4]); a new-class sample (label 2) gets the target
    [3/4, 1/4, 1] / 2, an old-class one (label 0) the old softmax alone; the student is uniform over the 3 classes."""
    logits = torch.zeros(2, 3, dtype=torch.float64)
    old_logits = torch.tensor([[L3, 0.0, 7.0]] * 2, dtype=torch.float64)
    seen, old = torch.ones(3, dtype=torch.bool), torch.tensor([True, True, False])
    got = relation_distillation(logits, torch.tensor([2, 0]), old_logits, seen, old, form="paper")

    def kl(t):
        return sum(p * math.log(3 * p) for p in t if p > 0)

    close(got, [kl([3 / 8, 1 / 8, 1 / 2]), kl([3 / 4, 1 / 4, 0])])


def test_combined_loss_halves_both_terms_once_an_old_model_exists():
    gc = gradient_compensation(LOGITS, Y, REAL, SEEN, OLD)
    rd = relation_distillation(LOGITS, Y, OLD_LOGITS, SEEN, OLD)
    torch.testing.assert_close(glfc_loss(LOGITS, Y, REAL, SEEN, OLD, OLD, None), gc)
    torch.testing.assert_close(glfc_loss(LOGITS, Y, REAL, SEEN, OLD, OLD, OLD_LOGITS), 0.5 * gc + 0.5 * rd)


@pytest.mark.parametrize("form", ["code", "paper"])
def test_the_distillation_reads_the_finished_classes_and_the_groups_the_learned_ones(form):
    """A client that learned no class (``old`` empty: every w_i = 1) still distils the finished tasks' class 0."""
    got = glfc_loss(LOGITS, Y, REAL, SEEN, NONE_OLD, OLD, OLD_LOGITS, form)
    gc = gradient_compensation(LOGITS, Y, REAL, SEEN, NONE_OLD, form)
    torch.testing.assert_close(got, 0.5 * gc + 0.5 * relation_distillation(LOGITS, Y, OLD_LOGITS, SEEN, OLD, form))
    assert not torch.allclose(got, glfc_loss(LOGITS, Y, REAL, SEEN, NONE_OLD, NONE_OLD, OLD_LOGITS, form))


@pytest.mark.parametrize("form", ["code", "paper"])
def test_a_stack_of_clients_under_vmap_equals_each_client(form):
    """Client 1 has no old class yet and a padded sample: no branch may depend on either."""
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    y, weight = torch.stack([Y, Y]), torch.stack([REAL, torch.tensor([1.0, 1, 0], dtype=torch.float64)])
    seen, old = torch.stack([SEEN, SEEN]), torch.stack([OLD, NONE_OLD])
    old_logits = torch.stack([OLD_LOGITS, OLD_LOGITS])
    finished = torch.stack([OLD, OLD])  # client 1 learned no old class yet distils the finished tasks' classes
    stacked = vmap(lambda *a: glfc_loss(*a, form=form))(logits, y, weight, seen, old, finished, old_logits)
    for c in range(2):
        torch.testing.assert_close(stacked[c], glfc_loss(logits[c], y[c], weight[c], seen[c], old[c], finished[c],
                                                         old_logits[c], form=form))


# ---- cfl's adaptation to task- and domain-incremental streams: the groups by task (glfc_loss_by_task) ----------
# One head of 3 columns, all seen. Sample 0 is a memory sample of a finished task (old), samples 1 and 2 of the
# running task; samples 0 and 1 share label 1 (Permuted MNIST: the same labels every task), so a grouping by class
# (w = 1/2, 3/2, 1) and the grouping by task differ.
TASK_LOGITS = torch.tensor([[0.0, L3, 0.0], [0.0, -L3, 0.0], [0.0, 0.0, L3]], dtype=torch.float64)
TASK_Y = torch.tensor([1, 1, 2])
OLD_SAMPLES = torch.tensor([True, False, False])
ALL_SEEN = torch.ones(3, dtype=torch.bool)
YES, NO = torch.tensor(True), torch.tensor(False)
# the old model on sample 0: sigmoids [1/2, 3/4, 1/4], softmax [3, 9, 1] / 13; on the new samples never read
TASK_OLD_LOGITS = torch.tensor([[0.0, L3, -L3], [9.0, 9, 9], [9.0, 9, 9]], dtype=torch.float64)
# code form: mean over 3 columns of BCE(z, onehot); g = 1/4, 3/4, 1/4; old group {0}: w0 = 1; new {1, 2}, mean 1/2
TASK_BASE = [(2 * L2 + math.log(4 / 3)) / 3, (2 * L2 + math.log(4)) / 3, (2 * L2 + math.log(4 / 3)) / 3]
TASK_W = [1.0, 1.5, 0.5]


def test_by_task_code_form_groups_the_memory_samples_of_finished_tasks():
    close(glfc_loss_by_task(TASK_LOGITS, TASK_Y, REAL, ALL_SEEN, OLD_SAMPLES, YES, None),
          [w * b for w, b in zip(TASK_W, TASK_BASE, strict=True)])


def test_by_task_weighs_every_sample_one_before_a_finished_task():
    close(glfc_loss_by_task(TASK_LOGITS, TASK_Y, REAL, ALL_SEEN, torch.zeros(3, dtype=torch.bool), NO, None),
          TASK_BASE)


def test_by_task_code_form_distils_the_whole_row_of_an_old_sample_only():
    """Sample 0's target is the old sigmoids [1/2, 3/4, 1/4] on every column: (ln 2 + ln 4 - 3/4 ln 3 + ln 2) / 3;
    a new sample's is its one-hot label, its L_RD its base loss."""
    rd = [(4 * L2 - 0.75 * L3) / 3, TASK_BASE[1], TASK_BASE[2]]
    close(glfc_loss_by_task(TASK_LOGITS, TASK_Y, REAL, ALL_SEEN, OLD_SAMPLES, YES, TASK_OLD_LOGITS),
          [0.5 * w * b + 0.5 * r for w, b, r in zip(TASK_W, TASK_BASE, rd, strict=True)])


def test_by_task_paper_form():
    """softmax: [1, 3, 1] / 5, [3, 1, 3] / 7, [1, 1, 3] / 5; p_y = 3/5, 1/7, 3/5; g = 2/5, 6/7, 2/5; new-group mean
    22/35: w = 1, 15/11, 7/11; CE = ln 5/3, ln 7, ln 5/3. L_RD: sample 0 KL([3, 9, 1] / 13 || [1, 3, 1] / 5) =
    12/13 ln 15/13 + 1/13 ln 5/13; the new samples KL(onehot || q) = their CE."""
    ce = [math.log(5 / 3), math.log(7), math.log(5 / 3)]
    w = [1.0, 15 / 11, 7 / 11]
    close(glfc_loss_by_task(TASK_LOGITS, TASK_Y, REAL, ALL_SEEN, OLD_SAMPLES, YES, None, form="paper"),
          [a * b for a, b in zip(w, ce, strict=True)])
    rd = [12 / 13 * math.log(15 / 13) + 1 / 13 * math.log(5 / 13), ce[1], ce[2]]
    close(glfc_loss_by_task(TASK_LOGITS, TASK_Y, REAL, ALL_SEEN, OLD_SAMPLES, YES, TASK_OLD_LOGITS, form="paper"),
          [0.5 * a * b + 0.5 * r for a, b, r in zip(w, ce, rd, strict=True)])


@pytest.mark.parametrize("form", ["code", "paper"])
def test_by_task_under_vmap_equals_each_client(form):
    """Client 1 has finished no task and a padded sample."""
    logits, y = torch.stack([TASK_LOGITS, TASK_LOGITS.flip(0)]), torch.stack([TASK_Y, TASK_Y])
    weight = torch.stack([REAL, torch.tensor([1.0, 1, 0], dtype=torch.float64)])
    seen, old = torch.stack([ALL_SEEN, ALL_SEEN]), torch.stack([OLD_SAMPLES, torch.zeros(3, dtype=torch.bool)])
    any_old, old_logits = torch.stack([YES, NO]), torch.stack([TASK_OLD_LOGITS, TASK_OLD_LOGITS])
    stacked = vmap(lambda *a: glfc_loss_by_task(*a, form=form))(logits, y, weight, seen, old, any_old, old_logits)
    for c in range(2):
        torch.testing.assert_close(stacked[c], glfc_loss_by_task(logits[c], y[c], weight[c], seen[c], old[c],
                                                                 any_old[c], old_logits[c], form=form))
