"""MFCL (Babakniya et al., "A Data-Free Approach to Mitigate Catastrophic Forgetting in Federated Class Incremental
Learning for Vision Tasks", NeurIPS 2023; official code ``SaraBabakN/MFCL-NeurIPS23`` at 8ab937b), class-incremental.

Server, at each task end but the last (``server_event``): the generator (kept across tasks) is trained against
the task's final global model, frozen, with its BatchNorm running statistics (cfl/ops/synthesis.py
``train_mfcl_generator``: content CE, information entropy, BN statistics, smoothness); the generator, that model
(the old model) and the seen classes go to each client once per task (``"task_start"``, counted).

Client, every local step of task ``t >= 1``: ``syn_size`` images of the broadcast generator (eval mode, the client's own
noise), labelled by the old model's argmax over the old classes, join the real batch (``samples``' replay part, so one
training-mode forward sees both, as in the code); the loss (``loss``'s task part, per sample) is ``CE over the new
classes (real samples of the task's classes) + w_ft * CE over the seen classes of the head on detached features + w_kd *
the old head's squared gap between current and old features`` (cfl/ops/mfcl_losses.py ``client_loss``), the features
from a second forward of the same batch (the code's, too). Task 0: the cross-entropy over its classes. The forward
inside the loss updates copies of the BatchNorm running statistics, which ``vmap`` cannot: sequential path."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call

from cfl.config.schema import ConfigError, field
from cfl.methods.base import Draw, LossContext, LossTerms, Method, RunInfo, Samples, SamplesContext, ServerEvent
from cfl.methods.bounds import GENERATED_BATCH_MAX, LR_MAX, NOISE_MAX, STEPS_MAX, WEIGHT_MAX, WIDTH_MAX
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.models.buffers import RUNNING_BN_MODEL, running_stats
from cfl.models.generator import MfclGenerator
from cfl.ops.data_free_clients import logits_and_features
from cfl.ops.distill import evaluating
from cfl.ops.losses import masked_cross_entropy
from cfl.ops.mfcl_losses import MfclWeights, feature_distillation
from cfl.ops.synthesis import Logits, MfclSettings, train_mfcl_generator
from cfl.tensors import Params


@dataclass(frozen=True)
class MFCLHyperparams:
    w_ft: float = field(1.0, "weight of the CE over the seen classes on detached features (official code: 1)",
                        min=0.0, max=WEIGHT_MAX)
    w_kd: float = field(0.1, "weight of the feature distillation through the old head (official code: 0.1)",
                        min=0.0, max=WEIGHT_MAX)
    syn_size: int = field(128, "synthetic images per local step (official code: the batch size, 128 in its "
                          "CIFAR-100 runs)", min=1, max=GENERATED_BATCH_MAX)
    generator_steps: int = field(100, "Adam steps of the generator at each task end (official code: 100)",
                                 min=1, max=STEPS_MAX)
    generator_batch: int = field(128, "noise vectors per generator step (official code: 128)",
                                 min=1, max=GENERATED_BATCH_MAX)
    generator_lr: float = field(1e-3, "the generator's Adam learning rate (official code: 1e-3)", gt=0.0, max=LR_MAX)
    nz: int = field(1000, "noise dimension (official code: 1000)", min=1, max=NOISE_MAX)
    generator_width: int = field(128, "the generator's wide convolution channels (official code: 128)",
                                 min=1, max=WIDTH_MAX)
    generator_hidden: int = field(64, "its last hidden convolution's channels (official code: 64)",
                                  min=1, max=WIDTH_MAX)
    w_ce: float = field(1.0, "generator: content CE weight (official code: 1)", min=0.0, max=WEIGHT_MAX)
    w_ie: float = field(1.0, "generator: information-entropy weight (official code: 1)", min=0.0, max=WEIGHT_MAX)
    w_bn: float = field(50.0, "generator: BatchNorm-statistics weight (official code: 50)", min=0.0, max=WEIGHT_MAX)
    w_smooth: float = field(1e-3, "generator: smoothness weight (official code: 1e-3)", min=0.0, max=WEIGHT_MAX)
    temperature: float = field(1000.0, "generator: the content CE's temperature (official code: 1000; at "
                               "most 1e4)", gt=0.0, max=1e4)
    kernel_quirk: bool = field(True, "the code's smoothing kernel exp(-(d / 2 sigma)^2) (std sqrt 2); false: the "
                               "usual Gaussian of std 1")
    eps_quirk: bool = field(True, "the code's inner generator BatchNorms with eps 0.8 (DCGAN's momentum read as eps)")


class MFCL(Method):
    name = "mfcl"
    about = "MFCL: server-trained data-free generator, clients' CE + detached-feature CE + feature distillation"
    Hyperparams = MFCLHyperparams
    sends = Sends(server_events=("before_task_end",),
                  broadcast={"task_start": ("generator", "old_model", "old_classes")})
    requires = Requires(running_stats_model=RUNNING_BN_MODEL, scenarios=("class",),
                        scenarios_why="its generator replays the earlier classes into one head")
    # under a schedule: the generator is trained when a task's last holder has left it (on the global model of that
    # moment, the old classes those of every task all holders have left) and sent to each client at its next
    # sampled round (cfl/engine/rounds/task_start.py)
    computes = Computes(losses=("task",), draws=("replay",),
                        sequential_reason="its loss's own forward of a model with BatchNorm running statistics "
                                          "updates them in place, which vmap cannot")

    def __init__(self, hparams: MFCLHyperparams, run_info: RunInfo) -> None:
        super().__init__(hparams, run_info)
        shape = tuple(run_info.input_shape)
        if len(shape) != 3 or shape[1] != shape[2] or shape[1] % 4:
            raise ConfigError(f"method mfcl's generator makes square images whose side is a multiple of 4; the "
                              f"stream's inputs are {shape}: use an image stream such as split-fmnist")
        self.channels, self.side = shape[0], shape[1]
        self._template: MfclGenerator | None = None

    def new_generator(self) -> MfclGenerator:
        """A generator of the run's settings, initialised from the run seed (not from torch's generator)."""
        h = self.hparams
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.run_info.seed)
            return MfclGenerator(h.nz, h.generator_width, h.generator_hidden, self.side, self.channels, h.eps_quirk)

    def generator_module(self) -> MfclGenerator:
        """The module the clients sample through (eval mode; its weights are the broadcast's: ``functional_call``)."""
        if self._template is None:
            self._template = self.new_generator().eval()
        return self._template

    # ---- the server's task end ----
    def server_event(self, ctx: ServerEvent) -> None:
        """Train the generator against the task's final global model; keep it, that model and the seen classes."""
        model, classes, server, task = ctx.model, ctx.classes, ctx.server, ctx.task
        h, device = self.hparams, next(model.parameters()).device
        generator = self.new_generator().to(device=device, dtype=next(model.parameters()).dtype)
        if "generator" in server:  # kept across tasks (a new optimiser each task)
            generator.load_state_dict(server["generator"])
        seen = torch.zeros(int(model.head.weight.shape[-2]), dtype=torch.bool, device=device)
        seen[classes.to(device)] = True
        settings = MfclSettings(h.generator_steps, h.generator_batch, h.generator_lr,
                                MfclWeights(h.w_ce, h.w_ie, h.w_bn, h.w_smooth, h.temperature), h.kernel_quirk)
        rng = torch.Generator().manual_seed(self.run_info.seed * 1_000_003 + task)
        training = train_mfcl_generator(Logits(model), generator, seen, settings, rng)
        server["generator"] = {k: v.detach().clone() for k, v in generator.state_dict().items()}
        server["old_model"] = {**{k: v.detach().clone() for k, v in model.named_parameters()}, **running_stats(model)}
        server["old_classes"] = seen
        stats = server.setdefault("stats", {})
        stats["generator_seconds"] = stats.get("generator_seconds", 0.0) + training.seconds
        stats["generator_steps"] = stats.get("generator_steps", 0) + len(training.objectives)
        stats["generator_objective_first"], stats["generator_objective_last"] = (training.objectives[0],
                                                                                training.objectives[-1])

    # ---- one client's step ----
    def samples(self, ctx: SamplesContext) -> Draw | None:
        """``syn_size`` images of the broadcast generator (eval mode) on the client's own noise, labelled by the old
        model's argmax over the old classes, appended to the step's batch; none in task 0."""
        if "generator" not in ctx.server:  # task 0
            return None
        server, weights, model, generator = ctx.server, ctx.server["generator"], self.run_info.model, ctx.generator
        z = torch.randn(self.hparams.syn_size, self.hparams.nz, generator=generator, device=generator.device)
        with torch.no_grad(), evaluating(model):
            images = functional_call(self.generator_module(), weights, (z.to(weights["project.weight"]),))
            tasks = torch.zeros(len(images), dtype=torch.long, device=images.device)
            old = functional_call(model, server["old_model"], (images, tasks))
        return Draw(replay=Samples(images, old.masked_fill(~server["old_classes"], float("-inf")).argmax(-1), tasks))

    def loss(self, ctx: LossContext) -> LossTerms:
        """Per sample of the batch (real and synthetic, one forward), MFCL's loss, weighted so that the engine's mean
        over the samples gives ``mean over the new-class samples of CE over the new classes + w_ft x mean CE over
        the seen classes on detached features + w_kd x mean feature distillation`` (cfl/ops/mfcl_losses.py
        ``client_loss``); task 0: the cross-entropy over the seen classes."""
        logits, y, x, task, allowed, server = ctx.logits, ctx.y, ctx.x, ctx.task, ctx.allowed, ctx.server
        if "old_model" not in server:
            return LossTerms(task=masked_cross_entropy(logits, y, allowed))
        model, old, h = self.run_info.model, server["old_classes"], self.hparams
        seen = old | allowed if allowed is not None else torch.ones_like(old)
        new = seen & ~old
        _, features = logits_and_features(model, self._with_buffers(ctx.params), x, task)  # the engine's features
        with torch.no_grad(), evaluating(model):
            _, old_features = logits_and_features(model, server["old_model"], x, task)
        old_head = _head(server["old_model"])
        kd = feature_distillation(functional_call(model.head, old_head, (features, task)),
                                  functional_call(model.head, old_head, (old_features, task)), old)
        frozen = functional_call(model.head, _head(ctx.params), (features.detach(), task))
        is_new = new[y]  # the real samples of the task's classes (the synthetic ones have old labels)
        scale = ctx.weight.sum() / (ctx.weight * is_new.to(ctx.weight.dtype)).sum().clamp(min=1.0)
        ce = masked_cross_entropy(logits, y, new)  # infinite on an old label: left out, not multiplied by 0
        ce_new = torch.where(is_new, ce, torch.zeros_like(ce)) * scale
        return LossTerms(task=ce_new + h.w_ft * masked_cross_entropy(frozen, y, seen) + h.w_kd * kd)

    def _with_buffers(self, params: Params) -> Params:
        """``params`` with copies of the template's running statistics (a training-mode forward updates the copies)."""
        return {**params, **running_stats(self.run_info.model)}


def _head(params: Params) -> Params:
    return {k.removeprefix("head."): v for k, v in params.items() if k.startswith("head.")}
