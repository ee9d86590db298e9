"""GLFC: Global-Local Forgetting Compensation (Dong et al., "Federated Class-Incremental Learning", CVPR 2022,
arXiv 2203.11473), class-incremental; the official code ``conditionWang/FCIL`` is the reference where the paper
is silent. GLFC's loss replaces the cross-entropy (``loss``'s task part); the proxy server scores each new global model
(``server_event("round")``).

Client, every local step: ``L_GC`` (class-aware gradient compensation; old classes = those the client learned), plus
``L_RD`` (relation distillation from the old model, of every class of the finished tasks, as the official
``_compute_loss``) once the server holds one, ``0.5 L_GC + 0.5 L_RD`` (cfl/ops/glfc_losses.py); memory samples appended
to each step (``samples``' replay part). At a task end, with the task's final global model: herding exemplars of the
client's classes into a memory of ``memory_size`` samples (cfl/ops/glfc_memory.py). In the first round of each task,
after training: per class it holds, the prototype, perturbed, encoded as the gradient of a fixed random LeNet, uploaded
(cfl/ops/glfc_proxy.py). Server (the proxy): reconstructs the uploads into a monitor set, scores each new global model
on it and keeps the best; at a task end the best becomes the old model, broadcast with every round's model (counted each
round). ``proxy: false`` is the ablation without the proxy server: the old model is the task's final global model.

Task- and domain-incremental streams (cfl's adaptation; GLFC's paper and code are class-incremental, FOT's is not
public): classes named by global id ``task x classes per head + label`` (memory, learned mask, LeNet labels, monitor
set); the loss's old group = samples of classes learned at earlier task ends, their whole row distilled
(``glfc_loss_by_task``); each reconstruction scored on its own task's head (docs/methods/glfc.md)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from cfl.config.schema import ConfigError, field
from cfl.methods.base import ClientData, Computes, Method, Payload, Sends, ServerEvent
from cfl.methods.bounds import LR_MAX, SAMPLES_MAX, STEPS_MAX
from cfl.methods.episodic_memory import draw_memory
from cfl.methods.training_hooks import ClientEndContext, Draw, LossContext, LossTerms, SamplesContext
from cfl.models.lenet import GradientLeNet, uniform_init_
from cfl.ops.distill import evaluating, frozen
from cfl.ops.features import head_features
from cfl.ops.glfc_losses import FORMS, glfc_loss, glfc_loss_by_task
from cfl.ops.glfc_memory import herd_into
from cfl.ops.glfc_proxy import BestModel, accuracy, finish_task, keep_best, monitor_set, prototype_gradients
from cfl.tensors import Params, State


@dataclass(frozen=True)
class GLFCHyperparams:
    form: str = field("code", "code: the official code's sigmoid/BCE losses (its numbers); paper: the paper's "
                      "softmax/cross-entropy and KL", choices=FORMS)
    memory_size: int = field(2000, "exemplar slots per client, shared equally by the classes it learned (official "
                             "code: 2000; beside ER+FL use ER's per-client budget)", min=1, max=SAMPLES_MAX)
    replay_batch_size: int | None = field(None, "memory samples appended to each local step (null: the run's "
                                          "batch_size; the official code shuffles them into the client's data)",
                                          min=1, max=SAMPLES_MAX)
    proxy: bool = field(True, "the proxy server picks the old model; false: the ablation without it (old model = "
                        "the finished task's final global model)")
    perturb_steps: int = field(50, "SGD steps perturbing each prototype (official code: 50)", min=0, max=STEPS_MAX)
    perturb_lr: float = field(0.001, "their learning rate (official code: the local lr / 10; the method is not told "
                              "the run's lr, so set it to lr / 10)", gt=0.0, max=LR_MAX)
    reconstruction_steps: int = field(250, "L-BFGS steps per reconstruction (official code: 250)", min=1, max=STEPS_MAX)
    reconstruction_lr: float = field(0.1, "L-BFGS learning rate (official code: 0.1)", gt=0.0, max=LR_MAX)
    reconstruction_iterations: int = field(20, "L-BFGS iterations per step (torch's max_iter; official code: "
                                           "torch's default 20; at most 1000: steps x iterations "
                                           "forward passes per reconstruction)", min=1, max=1000)
    reconstructions_kept: int = field(20, "last iterates kept per reconstruction (official code: 20)",
                                      min=1, max=STEPS_MAX)
    keep_best_score: bool = field(False, "the official code's quirk: the best score is never reset at a task switch")
    herding_repeats: bool = field(False, "the official code's quirk: herding may choose a sample twice")


class GLFC(Method):
    name = "glfc"
    about = "GLFC: gradient-compensation and relation-distillation losses, herding memory, proxy server"
    #: under a schedule: each client herds its memory at its own switch; the old model (the proxy's best) is made
    #: when a task's last holder has left it, and the prototypes are uploaded in the first round after that moment
    Hyperparams = GLFCHyperparams
    #: ``old_classes`` (class-incremental): the old model's classes, those of the tasks finished when it was made
    sends = Sends(server_events=("before_task_end", "round", "task_end"),
                  broadcast={"round": ("old_model", "old_classes", "round_in_task")}, server_task_end="last_holder")
    computes = Computes(losses=("task",), draws=("replay",))

    def __init__(self, hparams: GLFCHyperparams, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        if hparams.reconstructions_kept > hparams.reconstruction_steps:
            raise ConfigError(f"method.reconstructions_kept={hparams.reconstructions_kept} is above "
                              f"method.reconstruction_steps={hparams.reconstruction_steps}; lower it")
        head = getattr(run_info.model, "head", None)
        if not isinstance(getattr(head, "weight", None), torch.Tensor):
            raise ConfigError(f"method glfc reads features at the input of the model's head; "
                              f"{type(run_info.model).__name__} has no 'head' layer with a weight")
        self.classes = int(head.weight.shape[-2])  # a head's columns
        #: task- and domain-incremental (cfl's adaptation): groups by task, classes named by global id task x classes +
        #: label (memory, learned mask, LeNet labels, monitor set); class-incremental: the label itself
        self.by_task = run_info.scenario != "class"
        self.ids = self.classes * run_info.num_tasks if self.by_task else self.classes
        self._encoder: GradientLeNet | None = None
        self._client_seconds: dict[str, float] = {}  # the clients' phases since the last server_event

    def encoder(self, input_shape: tuple[int, ...], like: torch.Tensor) -> GradientLeNet:
        """The fixed random LeNet, the same for every client and the server (seeded by the run seed)."""
        if self._encoder is None:
            net = GradientLeNet(input_shape, self.ids)
            uniform_init_(net, torch.Generator().manual_seed(self.run_info.seed))
            self._encoder = net.to(device=like.device, dtype=like.dtype)
        return self._encoder

    def count_bytes(self, ctx: Payload) -> int | None:
        """Per client: the memory (an input, a label, a task id (int64), a valid flag per slot), the learned mask."""
        return None if (s := ctx.sizing) is None else s.num_clients * (
            self.hparams.memory_size * (s.sample_bytes + 8 + 8 + 1) + self.ids)

    def global_ids(self, y: torch.Tensor, task: torch.Tensor | int) -> torch.Tensor:
        """Each sample's class as the memory, the learned mask and the LeNet name it: ``task x classes + y`` on task-
        and domain-incremental streams, ``y`` on class-incremental ones."""
        return task * self.classes + y if self.by_task else y

    # ---- the local step ----
    def loss(self, ctx: LossContext) -> LossTerms:
        """Per sample, GLFC's loss in place of the cross-entropy."""
        logits, y, task, allowed, server, state = ctx.logits, ctx.y, ctx.task, ctx.allowed, ctx.server, ctx.state
        seen = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device) if allowed is None else allowed
        old_logits = None
        if "old_model" in server:
            with evaluating(self.run_info.model):
                old_logits = functional_call(self.run_info.model, server["old_model"], (ctx.x, task)).detach()
        if self.by_task:  # old: a sample of a (task, class) the client learned, i.e. of a finished task
            learned = state.get("learned", torch.zeros(self.ids, dtype=torch.bool, device=logits.device))
            old_samples = learned.gather(-1, self.global_ids(y, task))
            return LossTerms(task=glfc_loss_by_task(logits, y, ctx.weight, seen, old_samples, learned.any(-1),
                                                    old_logits, self.hparams.form))
        learned = state.get("learned", torch.zeros_like(seen))
        finished = torch.zeros_like(seen)
        if old_logits is not None:
            if "old_classes" not in server:
                raise ValueError("glfc: the server holds an old model without its classes ('old_classes', set at "
                                 "each task end since cfl distils every class of the finished tasks); restart the "
                                 "run instead of resuming a checkpoint written before")
            finished = server["old_classes"]
        return LossTerms(task=glfc_loss(logits, y, ctx.weight, seen, learned & seen, finished, old_logits,
                                        self.hparams.form))

    def samples(self, ctx: SamplesContext) -> Draw | None:
        return Draw(replay=draw_memory(ctx.state, ctx.generator,
                                       self.hparams.replay_batch_size or self.run_info.batch_size))

    # ---- client ends ----
    def client_end(self, ctx: ClientEndContext) -> State | None:
        start = time.perf_counter()
        if ctx.event == "task_end":
            self._herd(ctx.model, ctx.params, ctx.data, ctx.state)
            self._add_client_seconds("herding_seconds", start)
            return None
        if not self.hparams.proxy or int(ctx.server.get("round_in_task", 0)) != 0 or len(ctx.data.y) == 0:
            return None
        upload = {"gradients": self._prototype_upload(ctx.model, ctx.params, ctx.data, ctx.state)}
        self._add_client_seconds("prototype_upload_seconds", start)
        return upload

    def _add_client_seconds(self, phase: str, start: float) -> None:
        self._client_seconds[phase] = self._client_seconds.get(phase, 0.0) + time.perf_counter() - start

    def _herd(self, model: nn.Module, params: Params, data: ClientData, state: State) -> None:
        """The memory after the task: older classes truncated, the task's classes herded on the features of the
        task's final global model (``params``)."""
        if len(data.y) == 0:
            return
        features, _ = head_features(model, params, data.x, data.task)
        herd_into(state, data.x, data.y, data.task, features, self.hparams.memory_size, self.global_ids,
                  self.hparams.herding_repeats)
        data_ids = self.global_ids(data.y, data.task)
        learned = state.get("learned", torch.zeros(self.ids, dtype=torch.bool, device=data.x.device)).clone()
        learned[torch.unique(data_ids)] = True
        state["learned"] = learned

    def _prototype_upload(self, model: nn.Module, params: Params, data: ClientData,
                          state: State) -> list[list[torch.Tensor]]:
        """Per class the client holds: its perturbed prototype's LeNet gradient. The perturbation's loss runs over
        the classes the client learned and holds (our reading: the client is not told the run's seen classes); on
        task- and domain-incremental streams over the task's head, labelled by global class id for the LeNet."""
        features, _ = head_features(model, params, data.x, data.task)
        classes = [int(c) for c in torch.unique(data.y).tolist()]
        if self.by_task:
            seen = torch.ones(self.classes, dtype=torch.bool, device=data.x.device)
        else:
            seen = state.get("learned", torch.zeros(self.classes, dtype=torch.bool, device=data.x.device)).clone()
            seen[classes] = True
        task = torch.full((1,), data.task, dtype=torch.long, device=data.x.device)

        def logits_fn(v: torch.Tensor) -> torch.Tensor:
            return functional_call(model, params, (v, task))

        return prototype_gradients(logits_fn, features, data.x, data.y, classes,
                                   self.encoder(tuple(data.x.shape[1:]), data.x), seen, self.hparams.perturb_steps,
                                   self.hparams.perturb_lr,
                                   encoder_labels=[int(self.global_ids(torch.tensor(c), data.task)) for c in classes])

    # ---- the proxy server ----
    def server_event(self, ctx: ServerEvent) -> None:
        """Before a task end, class-incremental: the classes of the tasks finished now (``0..task``), the classes of
        the old model made at this task end (``_finish_task``), which ``L_RD`` distils. After each round: the
        monitor set reconstructed from the uploads, the new global model scored on it."""
        server, uploads, task = ctx.server, ctx.uploads, ctx.task
        if ctx.event == "before_task_end":
            if not self.by_task:
                finished = torch.zeros(self.classes, dtype=torch.bool, device=ctx.classes.device)
                finished[ctx.classes] = True
                server["finished_classes"] = finished
            return
        stats = server.setdefault("stats", {})
        for phase, seconds in self._client_seconds.items():  # the clients' phases, summed over the clients
            stats[phase] = stats.get(phase, 0.0) + seconds
        self._client_seconds = {}
        if ctx.event == "task_end":
            self._finish_task(server)
            return
        gradients = [g for cid in sorted(uploads) for g in uploads[cid]["gradients"]]
        if gradients and self._encoder is not None:
            start = time.perf_counter()
            seed = self.run_info.seed * 1_000_003 + task * 1009 + int(server.get("round_in_task", 0))
            x, y = monitor_set(self._encoder, gradients, self._encoder.input_shape, torch.Generator().manual_seed(seed),
                               self.hparams.reconstruction_steps, self.hparams.reconstruction_lr,
                               self.hparams.reconstructions_kept, self.hparams.reconstruction_iterations)
            server["monitor_x"], server["monitor_y"] = x, y
            stats["reconstruction_seconds"] = stats.get("reconstruction_seconds", 0.0) + time.perf_counter() - start
            stats["reconstructions"] = stats.get("reconstructions", 0) + len(gradients)
        server["round_in_task"] = int(server.get("round_in_task", 0)) + 1
        model, global_params = ctx.model, ctx.global_params  # scored on the monitor set: the best kept (proxy)
        if not self.hparams.proxy:  # the ablation: the model itself
            server["last_global"] = frozen(global_params)
            return
        if "monitor_x" not in server:
            return
        start = time.perf_counter()
        x, y = server["monitor_x"].to(next(iter(global_params.values())).dtype), server["monitor_y"]
        tasks = torch.full((len(x),), task, device=x.device)
        if self.by_task:  # global ids: each sample scored on its own task's head and label
            tasks, y = y // self.classes, y % self.classes
        with evaluating(model), torch.no_grad():
            logits = functional_call(model, global_params, (x, tasks))
        best = BestModel(server.get("best_score", -math.inf), server.get("best"))
        kept = keep_best(best, accuracy(logits, y), global_params)
        if kept is not best:
            server["best_score"], server["best"] = kept.score, frozen(global_params)
        stats = server.setdefault("stats", {})
        stats["scoring_seconds"] = stats.get("scoring_seconds", 0.0) + time.perf_counter() - start

    def _finish_task(self, server: State) -> None:
        if self.hparams.proxy:
            old, carried = finish_task(BestModel(server.get("best_score", -math.inf), server.get("best")),
                                       self.hparams.keep_best_score)
            server["best_score"] = carried.score
        else:
            old = server.get("last_global")
        finished = server.pop("finished_classes", None)
        if old is not None:
            server["old_model"] = old
            if finished is not None:  # class-incremental: the old model's classes
                server["old_classes"] = finished
        server["round_in_task"] = 0
