"""MFCL's generator and its training against a tiny frozen teacher: the steps lower the objective, the teacher
stays untouched, the time comes back."""

from __future__ import annotations

import copy

import pytest
import torch

from cfl.models.generator import MfclGenerator
from cfl.ops.synthesis import MfclSettings, train_mfcl_generator
from tests.bn_teacher import one_thread, tiny_teacher  # noqa: F401 (one_thread: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def small_generator(eps_quirk: bool = True) -> MfclGenerator:
    torch.manual_seed(3)
    return MfclGenerator(nz=8, width=8, hidden=4, image_size=8, channels=1, eps_quirk=eps_quirk)


def test_the_generator_gives_standardised_images_and_carries_the_eps_quirk():
    """The last BatchNorm (train mode) gives mean 0 and variance v / (v + 1e-5) of the tanh's variance v: just
    under 1."""
    gen = small_generator().train()
    images = gen.sample(64, torch.Generator().manual_seed(0))
    assert images.shape == (64, 1, 8, 8)
    assert abs(images.mean().item()) < 1e-5 and 0.98 < images.var(unbiased=False).item() < 1
    assert gen.block1[1].eps == 0.8 and small_generator(eps_quirk=False).block1[1].eps == 1e-5


def test_training_lowers_the_objective_and_leaves_the_teacher_alone():
    """Fresh noise each step: the mean of the last five objectives sits below the first five's."""
    teacher, gen = tiny_teacher(), small_generator()
    before = copy.deepcopy(teacher.state_dict())
    seen = torch.tensor([True, True, False])
    done = train_mfcl_generator(teacher, gen, seen, MfclSettings(iterations=40, batch_size=32, lr=0.01),
                                torch.Generator().manual_seed(0))
    assert len(done.objectives) == 40 and done.seconds > 0
    assert sum(done.objectives[-5:]) < sum(done.objectives[:5])
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not gen.training  # the clients sample it in eval mode
