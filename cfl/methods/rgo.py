"""RGO+FL: Recursive Gradient Optimization (Liu & Liu, ICLR 2022, arXiv 2201.12522) run by each client.

At each task end every client holding data of the task runs the task's final global model on its local data
and folds the Gram ``G`` of each protected layer's inputs (im2col patches for a conv layer, as GPM+FL) into
its own preconditioner ``P = alpha (alpha I + G_all)^-1``, kept as the deflation ``D = I - P``. Every later
local step (``round_terms``' preconditioner, before the optimiser's weight decay) preconditions the gradient of each
protected weight with the trace-normalised ``P~ = d P / trace(P)``: ``g <- g P~`` on the (out, d) view (on the
stacked path through the layer's inputs, ``delta^T (X P~)``). The server is
FedAvg and nothing is uploaded. Task 1 (no state) is FedAvg. The maths is in cfl/ops/rgo.py; see
docs/methods/rgo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.base import ClientEndContext, ClientRound, Computes, Method, Payload, RoundTerms, Sends
from cfl.methods.bounds import SAMPLES_MAX, WEIGHT_MAX
from cfl.ops.rgo import absorb_held, preconditioner_of, task_inputs


@dataclass(frozen=True)
class RGOHyperparams:
    alpha: float = field(1.0, "regulariser of (alpha I + G)^-1: smaller protects old inputs more (their "
                         "outputs move ~alpha / eigenvalue); the paper gives no value, see docs",
                         gt=0.0, max=WEIGHT_MAX)
    gram: str = field("mean", "the task Gram A A^T summed over its columns (sum) or averaged (mean: alpha "
                      "is then on the scale of one input's energy)", choices=("sum", "mean"))
    fel: bool = field(False, "the paper's virtual feature encoding layer (task-seeded unit permutations, "
                      "task-incremental only): not implemented, must stay false (the paper's RGO-2)")
    chunk: int = field(256, "samples per forward pass when collecting layer inputs (bounds memory)",
                       min=1, max=SAMPLES_MAX)


class RGO(Method):
    name = "rgo"
    about = "RGO+FL: each client preconditions its local gradients with (alpha I + G)^-1 of its old-task inputs"
    Hyperparams = RGOHyperparams
    sends = Sends(client_events=("task_end",))
    computes = Computes(terms=("preconditioner",))

    @classmethod
    def check(cls, hparams: RGOHyperparams, cfg: Config) -> None:  # noqa: ARG003
        if hparams.fel:
            raise ConfigError("'method.fel: true': RGO's virtual feature encoding layer permutes each layer's units "
                              "by a task-seeded permutation in the forward pass, at training and at test time "
                              "(task-incremental only); cfl's models take no such permutation, so it is not "
                              "implemented; use method.fel: false (the paper's RGO-2 ablation)")

    def __init__(self, hparams: RGOHyperparams, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        self.check(hparams, run_info)  # also when built directly

    def count_bytes(self, ctx: Payload) -> int | None:
        """One ``d x d`` deflation per protected layer and client (from its first task end on), in the model's
        precision (at least float32: :meth:`client_end`)."""
        return None if (s := ctx.sizing) is None else s.num_clients * max(
            4, next(self.run_info.model.parameters()).element_size()) * sum(d * d for _, d in s.protected.values())

    def client_end(self, ctx: ClientEndContext) -> None:
        model, params, data, state = ctx.model, ctx.params, ctx.data, ctx.state
        if len(data.x) == 0:
            return
        held = task_inputs(model, params, data.x, data.task, self.run_info.protected, self.hparams.gram,
                           self.hparams.chunk)
        deflations = state.setdefault("deflation", {})
        for name, inputs in held.items():
            d = inputs.matrix.shape[0]
            # kept in the weight's precision (at least float32): the step's ``d - trace D`` loses the digits of
            # ``P``'s small trace in float32 when G's spectrum is wide (a summed Gram, a small alpha), to 0 at large
            # inputs; a float64 run needs it in float64
            dtype = torch.promote_types(params[name].dtype, torch.float32)
            old = deflations.get(name, torch.zeros(d, d, dtype=dtype, device=inputs.matrix.device))
            deflations[name] = absorb_held(old, inputs, self.hparams.alpha).to(dtype)

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        """``P~ = d P / trace(P)`` with ``P = I - D`` for every protected weight the client holds a deflation of
        (none before its first task end: FedAvg's step)."""
        return RoundTerms(preconditioner={n: preconditioner_of(d) for n, d in ctx.state.get("deflation", {}).items()})
