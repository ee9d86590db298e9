"""A-GEM+FL: Averaged Gradient Episodic Memory (Chaudhry, Ranzato, Rohrbach & Elhoseiny, "Efficient Lifelong
Learning with A-GEM", ICLR 2019, arXiv 1812.00420) on each client, with its episodic memory of earlier tasks
(:class:`~cfl.methods.episodic_memory.EpisodicMemory`).

Each local step draws ``ref_batch_size`` memory samples (the paper's reference batch, from the client's own
generator) and takes their loss gradient ``g_ref`` at the step's parameters. Where the step's gradient ``g``
conflicts with it (``g . g_ref < 0``, over all parameters together) the step takes the paper's Eq. 11
projection instead,

    g~ = g - (g . g_ref / g_ref . g_ref) g_ref,

and ``g`` unchanged otherwise. The memory is not trained on. Before the first task end (no memory) A-GEM is
FedAvg. Nothing is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import Computes, Draw, SamplesContext, Step
from cfl.methods.bounds import SAMPLES_MAX
from cfl.methods.episodic_memory import EpisodicMemory
from cfl.tensors import Params


@dataclass(frozen=True)
class AGEMHyperparams:
    mem_per_client: int = field(100, "episodic memory slots per client (all earlier tasks together)",
                                min=1, max=SAMPLES_MAX)
    ref_batch_size: int = field(256, "memory samples of each step's reference gradient (256 in the paper; the "
                                "whole memory when it holds fewer)", min=1, max=SAMPLES_MAX)


class AGEM(EpisodicMemory):
    name = "agem"
    about = "A-GEM+FL: each client projects a step that would raise its memory's loss (Chaudhry et al. 2019)"
    Hyperparams, computes = AGEMHyperparams, Computes(draws=("step",))

    def samples(self, ctx: SamplesContext) -> Draw | None:
        return Draw(step=self.draw(ctx.state, ctx.generator, self.hparams.ref_batch_size))

    def step_gradient(self, step: Step) -> Params | None:
        if step.samples is None:  # no client of the batch holds a memory yet
            return None
        ref = step.gradient(step.samples.x, step.samples.y, step.samples.task, step.samples.weight)
        dot = sum((step.grads[k] * ref[k]).sum() for k in step.grads)
        norm = sum((r * r).sum() for r in ref.values())
        # a client without memory samples (weight 0 only) has g_ref = 0: dot = 0, no projection
        scale = torch.where(dot < 0, dot / norm.clamp(min=torch.finfo(norm.dtype).tiny), torch.zeros_like(dot))
        return {k: g - scale * ref[k] for k, g in step.grads.items()}
