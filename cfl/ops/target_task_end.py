"""TARGET's server work at a task end (official ``data_generation``): a new generator, synthesizer and student;
``syn_rounds`` synthesis rounds, each pooling its best batch; after each round past the warm-up, ``kd_steps`` of
student distillation on the pool (SGD lr 0.2, momentum 0.9, weight decay 1e-4, cosine over 200 rounds to 2e-4).

The student only feeds the adversarial term of later rounds (the code never ships it). The CIFAR-100 preset
(10 rounds, warm-up 20) reaches neither branch: its pool comes from the BN and CE terms alone
(:func:`cfl.ops.synthesis.adversarial_rounds`). The student starts from the teacher's architecture with PyTorch's
default initialisation (the code applies its own ``weight_init``; our simplification, it never matters under the
preset).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from cfl.models.generator import TargetGenerator
from cfl.ops.synthesis import Images, TargetSettings, TargetSynthesizer, distil_student, distillation_rounds
from cfl.ops.synthetic_pool import SyntheticPool


@dataclass(frozen=True)
class TargetTaskEndSettings:
    """The task end's settings (official CIFAR-100 preset)."""

    synthesis: TargetSettings = field(default_factory=TargetSettings)
    syn_rounds: int = 10
    pool_size: int = 8000
    quantize: bool = True
    nz: int = 256
    ngf: int = 64
    kd_steps: int = 400
    student_batch: int = 256
    student_lr: float = 0.2
    student_temperature: float = 20.0
    cosine_rounds: int = 200
    cosine_min_lr: float = 2e-4


@dataclass
class TargetTaskEnd:
    """The pool the clients train on next, and what the task end cost."""

    pool: SyntheticPool
    synthesis_seconds: float
    student_seconds: float
    adversarial_rounds: int
    distillation_rounds: int
    objectives: list[list[float]]


def fresh_copy(model: nn.Module) -> nn.Module:
    """``model``'s architecture with every layer re-initialised (``reset_parameters``), running statistics reset."""
    student = copy.deepcopy(model)
    for m in student.modules():
        if m is not student and hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return student.requires_grad_(True)


def target_task_end(teacher: nn.Module, classes: torch.Tensor, image_shape: tuple[int, int, int], prepare: Images,
                    rng: torch.Generator, settings: TargetTaskEndSettings) -> TargetTaskEnd:
    """Synthesise the pool of the finished task against ``teacher`` (images -> logits, running-stat BatchNorm) for
    the seen ``classes``; ``prepare``: generated images in ``[0, 1]`` -> the models' input (crop, flip,
    normalise). Every draw, the generator's and student's initialisation included, comes from ``rng`` (on CPU
    models: the same ``rng`` state gives the same pool, as a resumed run needs)."""
    channels, side, _ = image_shape
    device = next(teacher.parameters()).device
    with torch.random.fork_rng(devices=[]):  # initialised from ``rng``; torch's global generator untouched
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=rng)))
        generator = TargetGenerator(settings.nz, settings.ngf, side, channels).to(device)
        student = fresh_copy(teacher)
    synthesizer = TargetSynthesizer(generator, settings.synthesis)
    optimizer = torch.optim.SGD(student.parameters(), lr=settings.student_lr, momentum=0.9, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, settings.cosine_rounds, settings.cosine_min_lr)
    pool = SyntheticPool(settings.pool_size, settings.quantize)
    distil = set(distillation_rounds(settings.syn_rounds, settings.synthesis.warmup))
    synthesis_seconds = student_seconds = 0.0
    adversarial, objectives = 0, []
    for r in range(1, settings.syn_rounds + 1):
        done = synthesizer.synthesize(teacher, student, classes, prepare, rng, pool)
        synthesis_seconds += done.seconds
        adversarial += done.adversarial
        objectives.append(done.objectives)
        if r in distil:
            student_seconds += distil_student(student, teacher, classes, pool, settings.kd_steps,
                                              settings.student_batch, optimizer, prepare, rng,
                                              settings.student_temperature)
            schedule.step()
    return TargetTaskEnd(pool, synthesis_seconds, student_seconds, adversarial, len(distil), objectives)
