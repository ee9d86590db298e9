"""DER++ (Buzzega et al., "Dark Experience for General Continual Learning: a Strong, Simple Baseline", NeurIPS 2020,
arXiv 2004.07211) on each client.

Each client keeps a reservoir memory of ``mem_per_client`` samples of its own stream with the logits the model gave
them when they were inserted. Every local step draws two minibatches of ``replay_batch_size`` from it (each
without replacement, from the client's own generator) and adds ``alpha * MSE(f(x'), z')`` on the first and ``beta *
CE(f(x''), y'')`` on the second to the step's loss; after the step, the step's samples enter the memory by
reservoir sampling (``step.random``), with their logits at the step's starting parameters (a forward like the
step's). The memory lives in the step hooks' carry, so it fills during the round, and the client's state keeps it
between rounds. Nothing is communicated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.func import functional_call

from cfl.config.schema import field
from cfl.methods.base import ClientRoundStart, ClientStart, Method, Payload, Samples, Step
from cfl.methods.bounds import SAMPLES_MAX, WEIGHT_MAX
from cfl.methods.declarations import Computes
from cfl.methods.training_hooks import Draw, LossContext, LossTerms, SamplesContext
from cfl.tensors import State

MEMORY = ("x", "y", "task", "logits", "seen")


@dataclass(frozen=True)
class DERppHyperparams:
    mem_per_client: int = field(200, "reservoir memory slots per client", min=1, max=SAMPLES_MAX)
    alpha: float = field(0.3, "weight of the MSE between the memory's logits and the stored ones", min=0.0,
                         max=WEIGHT_MAX)
    beta: float = field(0.5, "weight of the cross-entropy on a second memory draw", min=0.0, max=WEIGHT_MAX)
    replay_batch_size: Optional[int] = field(None, "memory samples of each of the two draws (null: the run's "
                                             "batch_size, as in the paper)", min=1, max=SAMPLES_MAX)


class DERpp(Method):
    name = "derpp"
    about = "DER++: a per-step reservoir of samples and their logits, logit MSE + CE on memory draws"
    Hyperparams = DERppHyperparams
    computes = Computes(starts=("carry",), losses=("extra",), draws=("step",))

    def client_start(self, ctx: ClientRoundStart) -> ClientStart:
        if "seen" in (state := ctx.state):
            return ClientStart(carry={k: state[k] for k in MEMORY})
        m, like = self.hparams.mem_per_client, next(iter(ctx.global_params.values()))
        return ClientStart(carry={"x": like.new_zeros((m, *self.run_info.input_shape)),
                                  "y": torch.zeros(m, dtype=torch.long, device=like.device),
                                  "task": torch.zeros(m, dtype=torch.long, device=like.device),
                                  "logits": like.new_zeros((m, self.run_info.num_classes)),
                                  "seen": torch.zeros((), dtype=torch.long, device=like.device)})

    def samples(self, ctx: SamplesContext) -> Draw | None:
        filled = min(int((carry := ctx.carry)["seen"]), self.hparams.mem_per_client) if ctx.carry else 0
        if filled == 0:
            return None
        k, device = self.hparams.replay_batch_size or self.run_info.batch_size, carry["y"].device
        first = torch.randperm(filled, generator=ctx.generator)[:k].to(device)
        second = torch.randperm(filled, generator=ctx.generator)[:k].to(device)
        pick, mse = torch.cat([first, second]), torch.cat([torch.ones(len(first)), torch.zeros(len(second))]).to(device)
        return Draw(step=Samples(carry["x"][pick], carry["y"][pick], carry["task"][pick],
                                 extra={"logits": carry["logits"][pick], "mse": mse}))

    def loss(self, ctx: LossContext) -> LossTerms:
        x, samples = ctx.x, ctx.samples
        if samples is None:  # no client of the step has a memory yet
            return LossTerms(extra=x.new_zeros(x.shape[0]))
        out = functional_call(self.run_info.model, ctx.params, (samples.x, samples.task))
        w = samples.weight if samples.weight is not None else torch.ones_like(samples.extra["mse"])
        on_mse, on_ce = w * samples.extra["mse"], w * (1 - samples.extra["mse"])
        mse = ((out - samples.extra["logits"]) ** 2).mean(-1)
        ce = F.cross_entropy(out, samples.y, reduction="none")
        term = self.hparams.alpha * (on_mse * mse).sum() / on_mse.sum().clamp(min=1) + \
            self.hparams.beta * (on_ce * ce).sum() / on_ce.sum().clamp(min=1)
        return LossTerms(extra=term.expand(x.shape[0]))  # a batch-mean term: the mean over real samples keeps it

    def carry_step(self, step: Step) -> State:
        """Reservoir sampling (Vitter's algorithm R) of the step's real samples, in batch order: the ``n``-th sample
        seen goes to slot ``n`` while the memory has room, else to a slot drawn in ``[0, n]`` if below its size;
        a slot written twice in one step keeps the later sample."""
        carry, size = step.carry, self.hparams.mem_per_client
        real = step.weight > 0
        seen = carry["seen"] + torch.cumsum(real.long(), 0) - 1  # samples seen before each one
        drawn = step.random.integers(seen + 1, len(real))
        slot = torch.where(seen < size, seen, drawn)
        writes = (slot.unsqueeze(1) == torch.arange(size, device=slot.device)) & (real & (slot < size)).unsqueeze(1)
        order = torch.arange(1, len(real) + 1, device=slot.device).unsqueeze(1)
        writer = (writes * order).amax(0)  # (size,): 1 + the last sample written there, 0: none
        source, written = (writer - 1).clamp(min=0), writer > 0
        with torch.no_grad():
            logits = functional_call(self.run_info.model, step.params, (step.x, step.task))

        def put(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            return torch.where(written.view(-1, *[1] * (old.dim() - 1)), new[source].to(old.dtype), old)

        return {"x": put(carry["x"], step.x), "y": put(carry["y"], step.y), "task": put(carry["task"], step.task),
                "logits": put(carry["logits"], logits), "seen": carry["seen"] + real.long().sum()}

    def count_bytes(self, ctx: Payload) -> int | None:
        """Every client: ``mem_per_client`` inputs, labels and task ids (int64), logits (float32), one counter."""
        return None if (s := ctx.sizing) is None else s.num_clients * (
            self.hparams.mem_per_client * (s.sample_bytes + 8 + 8 + 4 * s.num_classes) + 8)
