"""TARGET (Zhang et al., "TARGET: Federated Class-Continual Learning via Exemplar-Free Distillation", ICCV 2023;
official code ``zj-jayzhang/Federated-Class-Continual-Learning``), class-incremental, exemplar-free.

Server, at every task end but the last (``server_event``): a new generator trained against the task's final
global model (BN-statistics, CE and, from round ``warmup``, adversarial terms; slow/fast generator), the best batch
of every synthesis round pooled as 8-bit images, a student distilled after the rounds past the warm-up
(cfl/ops/target_task_end.py). The pool, the teacher (parameters and running statistics) and the seen classes go
to each client once per task (``"task_start"``, counted).
Client, every local step: the cross-entropy over the current task's classes on its real batch (``loss``, task)
plus ``kd x`` the soft cross-entropy over the old classes of a synthetic batch against the teacher
(``loss``'s extra part, a forward of its own; docs/methods/target.md).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from cfl.config.schema import ConfigError, field
from cfl.data.augment import CropFlip
from cfl.methods.base import ClientRoundStart, ClientStart, Method, Samples, ServerEvent
from cfl.methods.bounds import (
    GENERATED_BATCH_MAX,
    LR_MAX,
    NOISE_MAX,
    SAMPLES_MAX,
    STEPS_MAX,
    TEMPERATURE_MAX,
    WEIGHT_MAX,
    WIDTH_MAX,
)
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.methods.training_hooks import Draw, LossContext, LossTerms, SamplesContext
from cfl.models.buffers import RUNNING_BN_MODEL, running_stats
from cfl.ops.distill import evaluating
from cfl.ops.synthesis import Images, Logits, TargetSettings, normalising
from cfl.ops.synthetic_pool import client_steps_per_epoch
from cfl.ops.target_losses import TargetWeights, new_class_cross_entropy, old_class_distillation
from cfl.ops.target_task_end import TargetTaskEndSettings, target_task_end


@dataclass(frozen=True)
class TargetHyperparams:
    kd: float = field(25.0, "weight of the clients' old-class distillation on synthetic data (official: 25)",
                      min=0.0, max=WEIGHT_MAX)
    temperature: float = field(2.0, "its temperature (official: 2)", gt=0.0, max=TEMPERATURE_MAX)
    syn_rounds: int = field(10, "synthesis rounds per task end (official preset: 10)", min=1, max=STEPS_MAX)
    warmup: int = field(20, "the adversarial term joins at this round, the student is distilled after the rounds "
                        "past it; the official preset's 20 > syn_rounds reaches neither (its quirk); set it below "
                        "syn_rounds for the paper's pipeline", min=0, max=STEPS_MAX)
    g_steps: int = field(10, "generator steps per synthesis round (official: 10)", min=1, max=STEPS_MAX)
    synthesis_batch: int = field(256, "images per synthesis round (official: 256)", min=1, max=GENERATED_BATCH_MAX)
    lr_g: float = field(0.002, "the fast generator's Adam learning rate (the slow one's: lr_g x g_steps)",
                        gt=0.0, max=LR_MAX)
    lr_z: float = field(0.01, "the noise batch's Adam learning rate", gt=0.0, max=LR_MAX)
    bn: float = field(10.0, "weight of the BN-statistics term", min=0.0, max=WEIGHT_MAX)
    oh: float = field(0.5, "weight of the teacher's cross-entropy term", min=0.0, max=WEIGHT_MAX)
    adv: float = field(1.0, "weight of the adversarial term", min=0.0, max=WEIGHT_MAX)
    bn_momentum: float = field(0.9, "momentum of the BN statistics over the rounds (0: none)", min=0.0, max=1.0)
    meta: str = field("fomaml", "the slow generator's update: fomaml (official) or reptile",
                      choices=("fomaml", "reptile"))
    nz: int = field(256, "the generator's noise width", min=1, max=NOISE_MAX)
    ngf: int = field(64, "the generator's base width", min=1, max=WIDTH_MAX // 2)
    nums: int = field(8000, "the pool's capacity (the code's nums; at most 2**18: 0.8 GB of 32x32x3 "
                      "images at 8 bits, 3.2 GB in float32)", min=1, max=2**18)
    quantize: bool = field(True, "pool images at 8 bits, as the code's PNG files; false: float32")
    synthetic_batch: int = field(500, "synthetic images per local step (the code: floor(nums / ceil(dataset size / "
                                 "(clients x tasks x batch))), 500 in its CIFAR-100 README run; "
                                 "cfl.ops.synthetic_pool.client_synthetic_batch)", min=1, max=SAMPLES_MAX)
    augment: bool = field(True, "random crop (padding 4) and flip of synthetic images, as the code's transform")
    image_mean: list[float] = field([0.0], "per channel (or one for all), the mean the stream's inputs were "
                                    "normalised with (split-fmnist: 0.2860), in [0, 1] as the generated images are",
                                    min=0.0, max=1.0)
    image_std: list[float] = field([1.0], "likewise the std (split-fmnist: 0.3530), in (0, 1]", gt=0.0,
                                   max=1.0)
    truncated_epochs: bool = field(True, "the code's zip of the real and the synthetic loaders: once a pool exists, "
                                   "a local epoch stops after ceil(pool images / synthetic_batch) steps when the "
                                   "client has more real batches; false: every real batch")
    kd_steps: int = field(400, "student SGD steps after each round past the warm-up (official: 400; at most "
                          "10 x STEPS_MAX, as these are steps of the small student)",
                          min=0, max=10 * STEPS_MAX)
    student_batch: int = field(256, "the student's pool batch (official: 256)", min=1, max=SAMPLES_MAX)


class Target(Method):
    name = "target"
    about = "TARGET: server generator (BN statistics, CE, adversarial), synthetic pool, clients' KD on it"
    Hyperparams = TargetHyperparams
    sends = Sends(server_events=("before_task_end",), broadcast={"task_start": ("pool", "old_model", "old_classes")},
                  client_events=())
    requires = Requires(running_stats_model=RUNNING_BN_MODEL, scenarios=("class",),
                        scenarios_why="its synthetic images distil the old classes of one head")
    computes = Computes(starts=("steps",), losses=("task", "extra"), draws=("step",))
    # under a schedule: the pool is synthesised when a task's last holder has left it (on the global model of that
    # moment, the old classes those of every task all holders have left) and sent to each client at its next
    # sampled round (cfl/engine/rounds/task_start.py)

    def __init__(self, hparams: TargetHyperparams, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        shape = tuple(run_info.input_shape)
        if len(shape) != 3:
            raise ConfigError(f"method target generates images (C, H, W); the stream's inputs are {shape}")
        for key in ("image_mean", "image_std"):
            if len(getattr(hparams, key)) not in (1, shape[0]):
                raise ConfigError(f"method.{key} has {len(getattr(hparams, key))} values; the images have "
                                  f"{shape[0]} channel(s): give 1 or {shape[0]}")
        print(f"method target: generated images in [0, 1] normalised with mean {hparams.image_mean} and std "
              f"{hparams.image_std} (method.image_mean/image_std: give the stream's normalisation)", file=sys.stderr)

    # ---- the client step ----
    def loss(self, ctx: LossContext) -> LossTerms:
        """Task part: per sample, the cross-entropy over the current task's classes (those the run allows, less the
        old ones). Extra part: ``kd x`` the mean old-class soft cross-entropy of the synthetic batch (train mode; its
        running-statistics updates are thrown away) against the teacher (eval mode), added to every sample."""
        logits, x, task, server, samples, allowed = ctx.logits, ctx.x, ctx.task, ctx.server, ctx.samples, ctx.allowed
        if ctx.part == "task":
            new = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device) if allowed is None else allowed
            if "old_classes" in server:
                new = new & ~server["old_classes"]
            return LossTerms(task=new_class_cross_entropy(logits, ctx.y, new))
        if samples is None or "old_model" not in server:
            return LossTerms(extra=x.new_zeros(x.shape[0]))
        model = self.run_info.model
        heads = task[:1].expand(len(samples.x))
        throwaway = {k: v.clone() for k, v in model.named_buffers()}
        student = functional_call(model, {**ctx.params, **throwaway}, (samples.x, heads))
        with torch.no_grad(), evaluating(model):
            teacher = functional_call(model, server["old_model"], (samples.x, heads))
        kd = old_class_distillation(student, teacher, server["old_classes"], self.hparams.temperature)
        weight = torch.ones_like(kd) if samples.weight is None else samples.weight
        return LossTerms(extra=x.new_zeros(x.shape[0]) + self.hparams.kd * (kd * weight).sum() / weight.sum())

    def client_start(self, ctx: ClientRoundStart) -> ClientStart | None:
        """The local steps of an epoch, the code's: ``zip(real loader, synthetic loader)`` stops at the shorter
        (:func:`cfl.ops.synthetic_pool.client_steps_per_epoch`); no pool (the first task): every real batch."""
        if not self.hparams.truncated_epochs or "pool" not in (server := ctx.server):
            return None
        real = math.ceil(ctx.num_samples / self.run_info.batch_size)
        return ClientStart(steps=client_steps_per_epoch(real, len(server["pool"]), self.hparams.synthetic_batch))

    def samples(self, ctx: SamplesContext) -> Draw | None:
        """A synthetic batch: ``synthetic_batch`` pool images drawn without replacement, as the model's input."""
        server, generator = ctx.server, ctx.generator
        if not server or "pool" not in server:
            return None
        pool = server["pool"]
        order = torch.randperm(len(pool), generator=generator, device=generator.device)[: self.hparams.synthetic_batch]
        images = pool[order.to(pool.device)]
        images = images.float() / 255 if images.dtype == torch.uint8 else images
        x = self._prepare(images.device, next(iter(server["old_model"].values())).dtype)(images, generator)
        zeros = torch.zeros(len(x), dtype=torch.long, device=x.device)
        return Draw(step=Samples(x, zeros, zeros))

    # ---- the server's task end ----
    def server_event(self, ctx: ServerEvent) -> None:
        """The pool of the finished task, the teacher and the seen classes for the next task's clients."""
        h, model, classes, server, task = self.hparams, ctx.model, ctx.classes, ctx.server, ctx.task
        settings = TargetTaskEndSettings(
            synthesis=TargetSettings(h.synthesis_batch, h.g_steps, h.lr_g, h.lr_z, TargetWeights(h.bn, h.oh, h.adv),
                                     h.warmup, h.bn_momentum, h.meta),
            syn_rounds=h.syn_rounds, pool_size=h.nums, quantize=h.quantize, nz=h.nz, ngf=h.ngf, kd_steps=h.kd_steps,
            student_batch=h.student_batch)
        like = next(model.parameters())
        device = like.device
        rng = torch.Generator().manual_seed(self.run_info.seed * 1_000_003 + task)  # the same pool on resume
        old = torch.zeros(self._classes(model), dtype=torch.bool, device=device)
        teacher = Logits(model, task).eval()  # the wrapper's mode is what the synthesis restores the model to
        done = target_task_end(teacher, classes, self.run_info.input_shape, self._prepare(device, like.dtype), rng,
                               settings)
        old[classes.to(device)] = True
        server["pool"] = done.pool.images
        server["old_model"] = {**{k: v.detach().clone() for k, v in model.named_parameters()}, **running_stats(model)}
        server["old_classes"] = old
        stats = server.setdefault("stats", {})
        for key, value in (("synthesis_seconds", done.synthesis_seconds), ("student_seconds", done.student_seconds),
                           ("adversarial_rounds", done.adversarial_rounds),
                           ("distillation_rounds", done.distillation_rounds), ("pool_images", len(done.pool))):
            stats[key] = stats.get(key, 0) + value

    def _classes(self, model: nn.Module) -> int:
        """The model's logits per sample (an eval-mode forward: the running statistics stay as they are)."""
        with torch.no_grad(), evaluating(model):
            probe = torch.zeros(1, *self.run_info.input_shape, device=next(model.parameters()).device)
            return int(model(probe, torch.zeros(1, dtype=torch.long, device=probe.device)).shape[-1])

    def _prepare(self, device: torch.device, dtype: torch.dtype) -> Images:
        """Images in ``[0, 1]`` -> the model's input (``dtype``): normalised as the stream's, cropped and flipped."""
        channels = self.run_info.input_shape[0]
        mean = torch.tensor(self.hparams.image_mean, device=device).expand(channels)
        std = torch.tensor(self.hparams.image_std, device=device).expand(channels)
        prepare = normalising(mean, std, CropFlip(4, -mean / std) if self.hparams.augment else None)
        return lambda images, rng: prepare(images, rng).to(dtype)
