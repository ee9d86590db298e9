"""TARGET's synthesis on a tiny frozen teacher: steps lower the objective, the slow generator's meta step, the
warm-up schedule (the preset never reaches its adversarial and distillation branches), the student's KD, timing."""

from __future__ import annotations

import copy

import pytest
import torch

from cfl.models.generator import TargetGenerator
from cfl.ops.synthesis import (
    TargetSettings,
    TargetSynthesizer,
    _accumulate,
    adversarial_rounds,
    distil_student,
    distillation_rounds,
    normalising,
)
from cfl.ops.synthetic_pool import SyntheticPool
from cfl.ops.target_losses import TargetWeights
from cfl.ops.target_task_end import TargetTaskEndSettings, target_task_end
from tests.bn_teacher import one_thread, tiny_teacher  # noqa: F401 (one_thread: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

PREPARE = normalising(torch.tensor([0.5]), torch.tensor([0.25]))
CLASSES = torch.tensor([0, 1, 2])


def synthesizer(**changes) -> TargetSynthesizer:
    torch.manual_seed(1)
    settings = TargetSettings(**{"batch_size": 16, "g_steps": 12, "lr_g": 0.01, "lr_z": 0.05, "warmup": 2,
                                 "weights": TargetWeights(bn=1.0, oh=1.0, adv=1.0), **changes})
    return TargetSynthesizer(TargetGenerator(nz=8, ngf=4, image_size=8, channels=1), settings)


def test_a_rounds_steps_lower_the_objective_and_pool_its_best_batch():
    synth, pool = synthesizer(), SyntheticPool(100)
    teacher = tiny_teacher()
    before = copy.deepcopy(teacher.state_dict())
    done = synth.synthesize(teacher, None, CLASSES, PREPARE, torch.Generator().manual_seed(0), pool)
    assert done.objectives[-1] < done.objectives[0]
    assert len(pool) == 16 and done.images.shape == (16, 1, 8, 8) and set(done.targets.tolist()) <= {0, 1, 2}
    assert done.seconds > 0 and not done.adversarial
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # frozen: buffers too
    assert not teacher.training and all(p.requires_grad for p in teacher.parameters())  # restored


def test_only_the_seen_classes_columns_count():
    """Classes [0, 2]: every label is one of them; a teacher column outside them (class 1) never enters the CE, so
    pushing it to +100 changes nothing."""
    teacher = tiny_teacher()
    runs = []
    for push in (0.0, 100.0):
        with torch.no_grad():
            teacher.head.bias[1] = push
        done = synthesizer(g_steps=2).synthesize(teacher, None, torch.tensor([0, 2]), PREPARE,
                                                 torch.Generator().manual_seed(0))
        runs.append(done)
    assert set(runs[0].targets.tolist()) == {0, 2}
    assert runs[0].objectives == pytest.approx(runs[1].objectives, rel=1e-6)


def test_the_slow_generator_takes_one_meta_step_of_lr_g_times_g_steps():
    """Two fast steps (fomaml): Adam's first step moves each slow parameter with a gradient by lr_g * g_steps =
    0.02 (up to eps: |g| / (|g| + 1e-8)), not lr_g."""
    synth = synthesizer(g_steps=2)
    slow = {k: v.detach().clone() for k, v in synth.generator.named_parameters()}
    synth.synthesize(tiny_teacher(), None, CLASSES, PREPARE, torch.Generator().manual_seed(0))
    for name, p in synth.generator.named_parameters():
        moved = (p.detach() - slow[name]).abs()
        assert torch.all(((moved - 0.02).abs() < 1e-4) | (p.grad.abs() < 1e-4)), name
        assert (p.grad.abs() >= 1e-4).any(), name


def test_fomaml_sums_the_fast_gradients():
    slow, fast = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    for g in (2.0, 3.0):
        fast.weight.grad = torch.tensor([[g]])
        fast.bias.grad = torch.tensor([g])
        _accumulate(slow, fast)
    assert slow.weight.grad.item() == 5.0 and slow.bias.grad.item() == 5.0


def test_reptile_takes_67_times_the_gap_to_the_fast_generator():
    """Three Adam steps of lr 0.01 move a fast parameter by about 0.03 where the gradient's sign holds (Adam's
    beta1 0.5 lets a step pass lr a little when the gradient grows): the largest slow gradient 67 |slow - fast|
    lies between 67 x 0.02 and 67 x 0.045 (a scale of 1 would give under 0.05)."""
    synth = synthesizer(meta="reptile", g_steps=3)
    synth.synthesize(tiny_teacher(), None, CLASSES, PREPARE, torch.Generator().manual_seed(0))
    grads = torch.cat([p.grad.flatten() for p in synth.generator.parameters()]).abs()
    assert 67 * 0.02 < grads.max() <= 67 * 0.045


def test_the_adversarial_term_joins_at_the_warmup_round():
    synth, teacher, student = synthesizer(warmup=2), tiny_teacher(), tiny_teacher(seed=5)
    rng = torch.Generator().manual_seed(0)
    flags = [synth.synthesize(teacher, student, CLASSES, PREPARE, rng).adversarial for _ in range(3)]
    assert flags == [False, True, True]


def test_the_presets_schedule_never_reaches_adversarial_or_distillation():
    """CIFAR-100 preset: syn_round 10, warmup 20."""
    assert adversarial_rounds(10, 20) == [] and distillation_rounds(10, 20) == []
    assert adversarial_rounds(22, 20) == [20, 21, 22] and distillation_rounds(22, 20) == [21, 22]


def test_the_momentum_statistics_start_after_the_first_round():
    synth = synthesizer()
    assert synth.momentum is None
    synth.synthesize(tiny_teacher(), None, CLASSES, PREPARE, torch.Generator().manual_seed(0))
    assert synth.momentum is not None and synth.momentum[0][0].shape == (4,)
    assert synthesizer(bn_momentum=0.0).momentum is None


def test_student_distillation_moves_the_student_toward_the_teacher():
    pool, teacher, student = SyntheticPool(64), tiny_teacher(), tiny_teacher(seed=7)
    rng = torch.Generator().manual_seed(0)
    pool.add(torch.rand(64, 1, 8, 8, generator=rng))
    x = PREPARE(pool.as_float(), rng)

    def gap() -> float:
        with torch.no_grad():
            return (torch.softmax(student.eval()(x), -1) - torch.softmax(teacher(x), -1)).abs().sum().item()

    before = gap()
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
    seconds = distil_student(student, teacher, CLASSES, pool, steps=30, batch_size=32, optimizer=optimizer,
                             prepare=PREPARE, rng=rng, temperature=2.0)
    assert gap() < before and seconds > 0


def test_a_generator_side_not_a_multiple_of_four_is_refused():
    with pytest.raises(ValueError, match="multiple of 4"):
        TargetGenerator(image_size=30)


def test_a_task_end_under_the_presets_schedule_pools_every_round_and_trains_no_student():
    """3 rounds, warm-up 20 (the preset's shape): 3 pooled batches, no adversarial round, no distillation."""
    settings = TargetTaskEndSettings(synthesis=TargetSettings(batch_size=8, g_steps=2, warmup=20), syn_rounds=3,
                                     pool_size=100, nz=8, ngf=4, kd_steps=2, student_batch=8)
    done = target_task_end(tiny_teacher(), CLASSES, (1, 8, 8), PREPARE, torch.Generator().manual_seed(0), settings)
    assert len(done.pool) == 24 and done.adversarial_rounds == 0 and done.distillation_rounds == 0
    assert done.synthesis_seconds > 0 and done.student_seconds == 0 and len(done.objectives) == 3


def test_a_task_end_past_the_warmup_distils_the_student():
    """Warm-up 2 over 3 rounds: the adversarial term in rounds 2 and 3, the student distilled after round 3."""
    settings = TargetTaskEndSettings(synthesis=TargetSettings(batch_size=8, g_steps=2, warmup=2), syn_rounds=3,
                                     pool_size=100, nz=8, ngf=4, kd_steps=2, student_batch=8)
    done = target_task_end(tiny_teacher(), CLASSES, (1, 8, 8), PREPARE, torch.Generator().manual_seed(0), settings)
    assert done.adversarial_rounds == 2 and done.distillation_rounds == 1 and done.student_seconds > 0


def test_a_task_end_draws_only_from_its_generator():
    """The same rng state gives the same pool bit for bit whatever torch's global generator holds, and leaves that
    generator where it was."""
    settings = TargetTaskEndSettings(synthesis=TargetSettings(batch_size=4, g_steps=2), syn_rounds=2, pool_size=100,
                                     nz=8, ngf=4)
    teacher, pools = tiny_teacher(), []
    for global_seed in (100, 200):
        torch.manual_seed(global_seed)
        done = target_task_end(teacher, CLASSES, (1, 8, 8), PREPARE, torch.Generator().manual_seed(4), settings)
        pools.append(done.pool.images)
        after = torch.rand(1)
        torch.manual_seed(global_seed)
        assert torch.equal(after, torch.rand(1))
    assert torch.equal(pools[0], pools[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_synthesis_runs_on_cuda_with_a_cpu_rng():
    settings = TargetTaskEndSettings(synthesis=TargetSettings(batch_size=8, g_steps=2), syn_rounds=2, pool_size=100,
                                     nz=8, ngf=4)
    done = target_task_end(tiny_teacher().cuda(), CLASSES, (1, 8, 8), PREPARE, torch.Generator().manual_seed(0),
                           settings)
    assert done.pool.images.is_cuda and len(done.pool) == 16 and done.synthesis_seconds > 0
