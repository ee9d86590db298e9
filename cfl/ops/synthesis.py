"""Server-side generator training of the data-free class-incremental methods, timed (the slow part of a run).

- :class:`TargetSynthesizer` (TARGET, ICCV 2023; official ``methods/target.py``, ``GlobalSynthesizer``): per
  synthesis round a FAST copy of the slow generator and a fresh noise batch are trained together for ``g_steps``
  Adam steps on ``bn * L_BN + oh * CE + adv * L_adv``; the batch of the step with the lowest objective goes to the
  pool; the SLOW generator then takes one meta step: ``fomaml`` (the CIFAR preset) sums the fast copy's gradient
  of every step, ``reptile`` uses ``67 * (slow - fast)``; its Adam has ``lr_g * g_steps``. The BatchNorm
  statistics may be blended with a momentum of earlier rounds' (``bn_momentum``).
- :func:`distil_student`: TARGET's student learns from the teacher on the pool (``kd_steps`` SGD steps).
- :func:`train_mfcl_generator` (MFCL, NeurIPS 2023; ``clients/helper.py``): Adam on the generator for
  ``iterations`` steps of fresh noise against the frozen teacher.

Each returns the seconds it took (CUDA synchronised), for ``method_stats``. The models are plain modules
mapping images to logits (:class:`Logits` adapts a cfl model, which also takes task ids); the teacher (and the
student during synthesis) run in eval mode and get no parameter gradients.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from cfl.ops.bn_statistics import (
    gaussian_statistics_loss,
    l2_statistics_loss,
    recording_batch_statistics,
    update_momentum,
)
from cfl.ops.mfcl_losses import MfclWeights, gaussian_kernel
from cfl.ops.mfcl_losses import generator_objective as mfcl_objective
from cfl.ops.synthetic_pool import SyntheticPool
from cfl.ops.target_losses import TargetWeights, student_distillation
from cfl.ops.target_losses import generator_objective as target_objective

Images = Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # (images in [0, 1], rng) -> the models' input


def normalising(mean: torch.Tensor, std: torch.Tensor, augment: Images | None = None) -> Images:
    """Generated images in ``[0, 1]`` -> ``(x - mean) / std`` per channel, then ``augment`` (e.g. TARGET's random
    crop with black padding and flip: :class:`cfl.data.augment.CropFlip` pads with the normalised black)."""
    def prepare(images: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        x = (images - mean.to(images).view(1, -1, 1, 1)) / std.to(images).view(1, -1, 1, 1)
        return x if augment is None else augment(x, rng)
    return prepare


class Logits(nn.Module):
    """A cfl model (``forward(x, task)``) as a module of images only, every sample given task ``task``."""

    def __init__(self, model: nn.Module, task: int = 0) -> None:
        super().__init__()
        self.model, self.task = model, task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, torch.full((x.shape[0],), self.task, dtype=torch.long, device=x.device))


@contextmanager
def frozen_eval(*models: nn.Module) -> Iterator[None]:
    """The models in eval mode with no parameter gradients inside the block; both restored after."""
    flags = [[p.requires_grad for p in m.parameters()] for m in models]
    modes = [m.training for m in models]
    for m in models:
        m.eval().requires_grad_(False)
    try:
        yield
    finally:
        for m, was, req in zip(models, modes, flags, strict=True):
            m.train(was)
            for p, r in zip(m.parameters(), req, strict=True):
                p.requires_grad_(r)


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


@dataclass(frozen=True)
class TargetSettings:
    """TARGET's synthesis settings (official CIFAR-100 preset)."""

    batch_size: int = 256
    g_steps: int = 10
    lr_g: float = 0.002
    lr_z: float = 0.01
    weights: TargetWeights = TargetWeights()
    warmup: int = 20  # the adversarial term joins from synthesis round ``warmup`` (1-based)
    bn_momentum: float = 0.9
    meta: Literal["fomaml", "reptile"] = "fomaml"
    reptile_scale: float = 67.0


@dataclass
class SynthesisRound:
    """One TARGET synthesis round: the pooled batch, its sampled labels, the objective at each step, whether the
    adversarial term was in it, seconds."""

    images: torch.Tensor
    targets: torch.Tensor
    objectives: list[float]
    adversarial: bool
    seconds: float


def adversarial_rounds(syn_rounds: int, warmup: int) -> list[int]:
    """The synthesis rounds (1-based) whose objective has the adversarial term: ``round >= warmup`` (the code's
    ``ep >= ep_start``). The CIFAR-100 preset (10 rounds, warm-up 20) has none."""
    return [r for r in range(1, syn_rounds + 1) if r >= warmup]


def distillation_rounds(syn_rounds: int, warmup: int) -> list[int]:
    """The synthesis rounds (1-based) after which the student is distilled: the code's 0-based ``it >= warmup``,
    i.e. ``round > warmup``. The CIFAR-100 preset (10 rounds, warm-up 20) has none: its student stays at its
    random initialisation and is never used."""
    return [r for r in range(1, syn_rounds + 1) if r > warmup]


@dataclass
class TargetSynthesizer:
    """The slow generator, its meta optimiser and the state carried between rounds of one task."""

    generator: nn.Module
    settings: TargetSettings
    rounds: int = 0
    momentum: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    meta_optimizer: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.meta_optimizer = torch.optim.Adam(self.generator.parameters(), s.lr_g * s.g_steps, betas=(0.5, 0.999))

    def synthesize(self, teacher: nn.Module, student: nn.Module | None, classes: torch.Tensor, prepare: Images,
                   rng: torch.Generator, pool: SyntheticPool | None = None) -> SynthesisRound:
        """One round: labels drawn uniformly from ``classes`` (the seen class ids, sorted), the fast generator and the
        noise trained, the slow generator stepped; ``prepare`` turns generated images into the models' input
        (TARGET: random crop, flip, normalise). Both models' logits are read on the ``classes`` columns only (the
        official network has no others). The student enters the objective from round ``warmup`` on."""
        s, device = self.settings, _device(self.generator)
        start = _now(device)
        self.rounds += 1
        adversary = student if s.weights.adv > 0 and self.rounds >= s.warmup else None  # adversarial_rounds' rule
        fast = copy.deepcopy(self.generator).train()
        z = torch.randn(s.batch_size, fast.nz, generator=rng, device=rng.device).to(device).requires_grad_()
        classes = classes.to(device)
        pick = torch.randint(len(classes), (s.batch_size,), generator=rng, device=rng.device).to(device)
        optimizer = torch.optim.Adam([{"params": fast.parameters()}, {"params": [z], "lr": s.lr_z}], lr=s.lr_g,
                                     betas=(0.5, 0.999))
        self.meta_optimizer.zero_grad()
        best, best_images, objectives = float("inf"), None, []
        models = (teacher,) if adversary is None else (teacher, adversary)
        with frozen_eval(*models), recording_batch_statistics(teacher) as layers:
            for _ in range(s.g_steps):
                layers.clear()
                images = fast(z)
                x = prepare(images, rng)
                t_logits = teacher(x)[:, classes]
                s_logits = None if adversary is None else adversary(x)[:, classes]
                bn = l2_statistics_loss(layers, self.momentum, s.bn_momentum)
                parts = target_objective(bn, t_logits, pick, s_logits, s.weights)
                loss = parts["total"]
                objectives.append(loss.item())
                if objectives[-1] < best or best_images is None:
                    best, best_images = objectives[-1], images.detach().clone()
                optimizer.zero_grad()
                loss.backward()
                if s.meta == "fomaml":
                    _accumulate(self.generator, fast)
                optimizer.step()
            if s.bn_momentum:
                self.momentum = update_momentum(layers, self.momentum, s.bn_momentum)
        if s.meta == "reptile":
            for slow_p, fast_p in zip(self.generator.parameters(), fast.parameters(), strict=True):
                slow_p.grad = s.reptile_scale * (slow_p.detach() - fast_p.detach())
        self.meta_optimizer.step()
        if pool is not None:
            pool.add(best_images)
        return SynthesisRound(best_images, classes[pick], objectives, adversary is not None, _now(device) - start)


def _accumulate(slow: nn.Module, fast: nn.Module) -> None:
    """First-order MAML: add the fast copy's current gradients to the slow generator's."""
    for slow_p, fast_p in zip(slow.parameters(), fast.parameters(), strict=True):
        g = torch.zeros_like(slow_p) if fast_p.grad is None else fast_p.grad.detach()
        slow_p.grad = g.clone() if slow_p.grad is None else slow_p.grad + g


def distil_student(student: nn.Module, teacher: nn.Module, classes: torch.Tensor, pool: SyntheticPool, steps: int,
                   batch_size: int, optimizer: torch.optim.Optimizer, prepare: Images, rng: torch.Generator,
                   temperature: float = 20.0) -> float:
    """TARGET's ``kd_train``: ``steps`` optimiser steps of the student (train mode) on pool batches (``prepare``:
    crop, flip, normalise) toward the teacher's soft labels over the ``classes`` columns; returns the seconds."""
    device = _device(student)
    start = _now(device)
    classes = classes.to(device)
    student.train()
    with frozen_eval(teacher):
        for _ in range(steps):
            x = prepare(pool.draw(batch_size, rng).to(device), rng)
            with torch.no_grad():
                t_logits = teacher(x)[:, classes]
            loss = student_distillation(student(x)[:, classes], t_logits, temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return _now(device) - start


@dataclass(frozen=True)
class MfclSettings:
    """MFCL's generator training settings (official defaults)."""

    iterations: int = 100
    batch_size: int = 128
    lr: float = 1e-3
    weights: MfclWeights = MfclWeights()
    kernel_quirk: bool = True


@dataclass
class GeneratorTraining:
    """The objective at each step and the seconds the training took."""

    objectives: list[float]
    seconds: float


def train_mfcl_generator(teacher: nn.Module, generator: nn.Module, seen: torch.Tensor, settings: MfclSettings,
                         rng: torch.Generator) -> GeneratorTraining:
    """Train ``generator`` (train mode; left in eval mode after, as the clients sample it) against the frozen
    ``teacher``'s logits over the ``seen`` classes (bool ``(K,)``) with a fresh Adam."""
    device = _device(generator)
    start = _now(device)
    optimizer = torch.optim.Adam(generator.parameters(), lr=settings.lr)
    kernel = gaussian_kernel(code_quirk=settings.kernel_quirk).to(device)
    objectives = []
    generator.train()
    with frozen_eval(teacher), recording_batch_statistics(teacher) as layers:
        for _ in range(settings.iterations):
            layers.clear()
            images = generator.sample(settings.batch_size, rng)
            logits = teacher(images)[:, seen.to(device)]
            loss = mfcl_objective(logits, gaussian_statistics_loss(layers), images, kernel, settings.weights)["total"]
            objectives.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    generator.eval()
    return GeneratorTraining(objectives, _now(device) - start)
