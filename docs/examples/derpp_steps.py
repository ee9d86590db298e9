"""DER++ (Buzzega et al., NeurIPS 2020) as a plugin: a reservoir memory filled at every step, in the carry."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call

from cfl.plugin import ClientStart, Computes, Draw, LossTerms, Method, Samples, Step, field, register


@dataclass(frozen=True)
class Hyperparams:
    size: int = field(200, "reservoir slots per client", min=1, max=2**20)
    alpha: float = field(0.3, "weight of the logit MSE", min=0.0, max=1e6)
    beta: float = field(0.5, "weight of the memory cross-entropy", min=0.0, max=1e6)


@register
class MyDERpp(Method):
    name = "my-derpp"
    about = "DER++ written from docs/plugins.md"
    Hyperparams = Hyperparams
    computes = Computes(starts=("carry",), losses=("extra",), draws=("step",))

    def client_start(self, ctx):
        if "seen" in ctx.state:  # the memory kept from the client's last round
            return ClientStart(carry={k: ctx.state[k] for k in ("x", "y", "task", "logits", "seen")})
        n, info = self.hparams.size, self.run_info
        return ClientStart(carry={"x": torch.zeros(n, *info.input_shape), "y": torch.zeros(n, dtype=torch.long),
                                  "task": torch.zeros(n, dtype=torch.long), "logits": torch.zeros(n, info.num_classes),
                                  "seen": torch.zeros((), dtype=torch.long)})

    def samples(self, ctx):
        generator, carry = ctx.generator, ctx.carry
        filled = min(int(carry["seen"]), self.hparams.size)
        if filled == 0:
            return None
        b = self.run_info.batch_size
        pick = torch.cat([torch.randperm(filled, generator=generator)[:b] for _ in range(2)])
        first = torch.arange(len(pick)) < len(pick) // 2  # the MSE draw, then the CE draw
        return Draw(step=Samples(carry["x"][pick], carry["y"][pick], carry["task"][pick],
                       extra={"logits": carry["logits"][pick], "mse": first.float()}))

    def loss(self, ctx):
        params, x, samples = ctx.params, ctx.x, ctx.samples
        if samples is None:
            return LossTerms(extra=x.new_zeros(x.shape[0]))
        out = functional_call(self.run_info.model, params, (samples.x, samples.task))
        mse, ce = samples.weight * samples.extra["mse"], samples.weight * (1 - samples.extra["mse"])
        mse_loss = (mse * ((out - samples.extra["logits"]) ** 2).mean(-1)).sum() / mse.sum().clamp(min=1)
        ce_loss = (ce * F.cross_entropy(out, samples.y, reduction="none")).sum() / ce.sum().clamp(min=1)
        term = self.hparams.alpha * mse_loss + self.hparams.beta * ce_loss  # a batch-mean term on every sample
        return LossTerms(extra=term.expand(x.shape[0]))

    def carry_step(self, step: Step):  # under vmap: tensor code, random numbers from step.random
        carry, size, real = step.carry, self.hparams.size, step.weight > 0
        seen = carry["seen"] + torch.cumsum(real.long(), 0) - 1
        slot = torch.where(seen < size, seen, step.random.integers(seen + 1, len(real)))
        hits = (slot[:, None] == torch.arange(size)) & (real & (slot < size))[:, None]
        last = (hits * torch.arange(1, len(real) + 1)[:, None]).amax(0)  # a slot hit twice keeps the later sample
        with torch.no_grad():
            logits = functional_call(self.run_info.model, step.params, (step.x, step.task))

        def put(old, new):
            return torch.where((last > 0).view(-1, *[1] * (old.dim() - 1)), new[(last - 1).clamp(min=0)], old)

        return {"x": put(carry["x"], step.x), "y": put(carry["y"], step.y), "task": put(carry["task"], step.task),
                "logits": put(carry["logits"], logits), "seen": carry["seen"] + real.sum()}

    def count_bytes(self, ctx):
        if ctx.kind != "client_state":  # only the clients' state has no default worth keeping
            return None
        s = ctx.sizing
        return s.num_clients * self.hparams.size * (s.sample_bytes + 16 + 4 * s.num_classes)
