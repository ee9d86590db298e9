"""A-GEM (Chaudhry et al., ICLR 2019) as a plugin: a memory, a reference batch and a gradient projection."""

from dataclasses import dataclass

import torch

from cfl.plugin import Computes, Draw, Method, Samples, Sends, Step, field, register


@dataclass(frozen=True)
class Hyperparams:
    per_task: int = field(20, "memory samples each client keeps of each finished task", min=1)
    ref_batch_size: int = field(64, "memory samples of each step's reference gradient", min=1)


@register
class MyAGEM(Method):
    name = "my-agem"
    about = "A-GEM written from docs/plugins.md"
    Hyperparams = Hyperparams
    sends = Sends(client_events=("task_end",), downloads_model_at_task_end=False)  # the memory is local data
    computes = Computes(draws=("step",))

    def client_end(self, ctx):
        data, state, generator = ctx.data, ctx.state, ctx.generator
        slots = self.hparams.per_task * self.run_info.num_tasks
        if "x" not in state:
            state["x"] = torch.zeros(slots, *data.x.shape[1:], dtype=data.x.dtype, device=data.x.device)
            state["y"] = torch.zeros(slots, dtype=torch.long, device=data.x.device)
            state["task"] = torch.zeros(slots, dtype=torch.long, device=data.x.device)
            state["valid"] = torch.zeros(slots, dtype=torch.bool, device=data.x.device)
        pick = torch.randperm(len(data.y), generator=generator)[: self.hparams.per_task].to(data.x.device)
        rows = slice(data.task * self.hparams.per_task, data.task * self.hparams.per_task + len(pick))
        state["x"][rows], state["y"][rows], state["valid"][rows] = data.x[pick], data.y[pick], True
        state["task"][rows] = data.task
        return None

    def count_bytes(self, ctx):
        if ctx.kind != "client_state":  # only the clients' state has no default worth keeping
            return None
        s = ctx.sizing
        return s.num_clients * self.hparams.per_task * s.num_tasks * (s.sample_bytes + 8 + 8 + 1)

    def samples(self, ctx):
        state, generator = ctx.state, ctx.generator
        if "valid" not in state:
            return None
        rows = state["valid"].nonzero().flatten()
        pick = rows[torch.randperm(len(rows), generator=generator)[: self.hparams.ref_batch_size].to(rows.device)]
        return Draw(step=Samples(state["x"][pick], state["y"][pick], state["task"][pick]))

    def step_gradient(self, step: Step):
        if step.samples is None:  # no client of this batch has a memory yet
            return None
        s = step.samples
        ref = step.gradient(s.x, s.y, s.task, s.weight)
        dot = sum((step.grads[k] * ref[k]).sum() for k in ref)
        norm = sum((r * r).sum() for r in ref.values())
        # no Python `if` on a tensor's value: torch.where keeps the hook one client's math under vmap
        scale = torch.where(dot < 0, dot / norm.clamp(min=1e-30), torch.zeros_like(dot))
        return {k: g - scale * ref[k] for k, g in step.grads.items()}
