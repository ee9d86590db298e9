"""GLFC's proxy server pieces: the LeNet, the prototype and its perturbation, label inference from a LeNet gradient,
a gradient-matching reconstruction, the best-old-model selection and the entropy signal."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.models.lenet import GradientLeNet, image_shape, uniform_init_
from cfl.ops.glfc_proxy import (
    BestModel,
    accuracy,
    encoder_gradient,
    finish_task,
    gradient_distance,
    infer_label,
    keep_best,
    mean_entropy,
    monitor_set,
    new_task_signal,
    perturb,
    prototype_gradients,
    prototype_index,
    prototype_loss,
    reconstruct,
)


def lenet(input_shape: tuple[int, ...], classes: int, seed: int = 0) -> GradientLeNet:
    return uniform_init_(GradientLeNet(input_shape, classes), torch.Generator().manual_seed(seed)).double()


def test_lenet_matches_the_official_sizes():
    """3x32x32: 16x16, 8x8, 8x8 maps of 12 channels, 768 features (the official code's hidden=768); 784 flat: 1x28x28
    gives 12 * 7 * 7 = 588."""
    net = GradientLeNet((3, 32, 32), 100)
    assert net.fc.in_features == 768 and [tuple(c.weight.shape) for c in net.body if hasattr(c, "weight")] == [
        (12, 3, 5, 5), (12, 12, 5, 5), (12, 12, 5, 5)]
    assert GradientLeNet((784,), 10).fc.in_features == 588
    assert image_shape((784,)) == (1, 28, 28)
    with pytest.raises(ValueError, match="square"):
        image_shape((3, 32, 30))


def test_uniform_init_is_seeded_and_bounded():
    a, b, c = lenet((1, 8, 8), 4, seed=1), lenet((1, 8, 8), 4, seed=1), lenet((1, 8, 8), 4, seed=2)
    params = torch.cat([p.flatten() for p in a.parameters()])
    assert params.abs().max() <= 0.5 and params.abs().max() > 0.45 and params.std() > 0.25  # U(-.5, .5): sd 0.289
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_prototype_is_the_sample_nearest_the_normalised_mean():
    """(1, 0), (0, 1) and (1, 1): the diagonal one is nearest the mean of the normalised three, even scaled down."""
    assert prototype_index(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.1, 0.1]])) == 2


def test_prototype_loss_is_the_mean_bce_over_the_seen_columns():
    """logits [ln 3, 0, 9], class 0, column 2 unseen: (BCE(ln 3, 1) + BCE(0, 0)) / 2 = (ln 4/3 + ln 2) / 2."""
    logits = torch.tensor([[math.log(3), 0.0, 9.0]], dtype=torch.float64)
    got = prototype_loss(logits, 0, torch.tensor([True, True, False]))
    assert float(got) == pytest.approx((math.log(4 / 3) + math.log(2)) / 2, abs=1e-12)


def test_perturb_takes_sgd_steps_with_weight_decay_on_the_input():
    """loss = 3 x0 - x1, lr 0.1, weight decay 0.5: x <- x - 0.1 (c + 0.5 x); from (1, 2): (0.65, 2.0), (0.3175, 2.0)."""
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    c = torch.tensor([3.0, -1.0], dtype=torch.float64)
    got = perturb(x, lambda v: (v * c).sum(), steps=2, lr=0.1, weight_decay=0.5)
    torch.testing.assert_close(got, torch.tensor([0.3175, 2.0], dtype=torch.float64))
    assert x.tolist() == [1.0, 2.0] and not got.requires_grad


def test_label_from_the_last_layer_row_with_the_smallest_sum():
    grad = torch.tensor([[1.0, 2.0], [-3.0, 1.0], [0.5, 0.5]])  # row sums 3, -2, 1
    assert infer_label(grad) == 1


@pytest.mark.parametrize("label", [0, 3, 6])
def test_label_inferred_from_a_lenet_gradient(label):
    net = lenet((3, 8, 8), 7)
    x = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(label), dtype=torch.float64)
    grads = encoder_gradient(net, x, label)
    assert [g.shape for g in grads] == [p.shape for p in net.parameters()]
    assert infer_label(grads[-2]) == label
    assert all(p.grad is None for p in net.parameters())  # the encoder is never trained


def test_gradient_distance_by_hand():
    a = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    b = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    assert float(gradient_distance(a, b)) == 1 + 4 + 4


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread (0.6 s here) instead of several fighting over 2 busy cores (13 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_reconstruction_matches_its_target_gradient():
    """A tiny LeNet (1x8x8, 4 classes): 3 L-BFGS steps from N(0, 1) take the gradient distance from 1.7 to 4e-5,
    and the reconstruction carries the inferred label."""
    net = lenet((1, 8, 8), 4, seed=3)
    x_true = torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    target = encoder_gradient(net, x_true, 2)
    rec = reconstruct(net, target, (1, 8, 8), torch.Generator().manual_seed(1), steps=3, keep=2)
    assert rec.label == 2 and rec.samples.shape == (2, 1, 8, 8)
    assert rec.final_distance < 1e-3 * rec.start_distance, (rec.start_distance, rec.final_distance)
    final_grads = encoder_gradient(net, rec.samples[-1], 2)
    assert float(gradient_distance(final_grads, target)) == pytest.approx(rec.final_distance, rel=1e-9)
    assert all(p.grad is None for p in net.parameters())


def test_reconstruction_refuses_more_kept_iterates_than_steps():
    net = lenet((1, 8, 8), 4)
    target = encoder_gradient(net, torch.zeros(1, 8, 8, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="keep=5"):
        reconstruct(net, target, (1, 8, 8), torch.Generator(), steps=4, keep=5)


def test_best_model_is_kept_on_ties_and_replaced_only_by_a_score_at_least_as_high():
    a, b, c = {"w": torch.zeros(1)}, {"w": torch.ones(1)}, {"w": torch.full((1,), 2.0)}
    best = keep_best(keep_best(BestModel(), 0.5, a), 0.5, b)  # a tie: the newer model (the code's >=)
    assert best.params is b
    assert keep_best(best, 0.4, c) is best
    assert keep_best(best, 0.6, c).params is c


def test_finish_task_hands_over_the_best_and_restarts_its_score():
    best = BestModel(0.9, {"w": torch.ones(1)})
    old, carried = finish_task(best)
    assert old is best.params and carried.score == -math.inf
    assert keep_best(carried, 0.2, {"w": torch.zeros(1)}).score == 0.2  # the first model of the new task is kept
    _, quirk = finish_task(best, keep_score=True)  # the official code: the old task's 0.9 must be beaten
    assert keep_best(quirk, 0.2, {"w": torch.zeros(1)}) is quirk


def test_accuracy_of_a_model_on_reconstructions():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 1.0], [1.0, 0.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1, 1])) == 0.5


def test_entropy_signal():
    """Uniform over 4 seen classes (the fifth unseen): entropy -4 * 1/4 * ln(1/4 + 1e-5), about ln 4; a sure
    prediction about 0; a rise of ln 4 = 1.39 nats flags new classes, one of ln 2 = 0.69 does not."""
    seen = torch.tensor([True, True, True, True, False])
    uniform = torch.tensor([[0.0, 0.0, 0.0, 0.0, 50.0]] * 2)
    assert mean_entropy(uniform, seen) == pytest.approx(-math.log(0.25 + 1e-5), abs=1e-6)
    assert mean_entropy(torch.tensor([[60.0, 0.0, 0.0, 0.0, 0.0]]), seen) == pytest.approx(0.0, abs=1e-4)
    assert new_task_signal(math.log(4), 0.0) and not new_task_signal(math.log(2), 0.0)


def test_head_features_are_the_heads_input():
    from cfl.models.mlp import MLP
    from cfl.ops.features import head_features

    torch.manual_seed(0)
    model = MLP(6, [5], 3, num_tasks=2, multi_head=True)
    params = dict(model.named_parameters())
    x = torch.randn(7, 6)
    features, logits = head_features(model, params, x, task=1, chunk=3)
    torch.testing.assert_close(features, model.body(x))
    torch.testing.assert_close(logits, model(x, torch.ones(7, dtype=torch.long)))
    with pytest.raises(ValueError, match="no 'head'"):
        head_features(torch.nn.Linear(6, 3), {}, x, task=0)


@pytest.mark.usefixtures("one_thread")
def test_a_clients_upload_reconstructs_into_a_monitor_set_with_its_labels():
    """Two classes' prototypes (the samples nearest their class means), perturbed, encoded by the LeNet; the server
    infers each label from the gradient alone and reconstructs 2 samples per upload."""
    net = lenet((1, 8, 8), 4, seed=5)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(6, 1, 8, 8, generator=gen, dtype=torch.float64)
    y = torch.tensor([1, 3, 1, 3, 1, 3])
    features = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    weight = torch.randn(4, 64, generator=gen, dtype=torch.float64)
    seen = torch.tensor([True, True, True, True])
    uploads = prototype_gradients(lambda v: v.flatten(1) @ weight.T, features, x, y, [1, 3], net, seen, steps=3)
    assert [infer_label(g[-2]) for g in uploads] == [1, 3]
    mx, my = monitor_set(net, uploads, (1, 8, 8), torch.Generator().manual_seed(1), steps=2, keep=2)
    assert mx.shape == (4, 1, 8, 8) and my.tolist() == [1, 1, 3, 3]
    with pytest.raises(ValueError, match="class 2 has no sample"):
        prototype_gradients(lambda v: v.flatten(1) @ weight.T, features, x, y, [2], net, seen)
