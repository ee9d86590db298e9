"""FedWeIT: Federated Weighted Inter-client Transfer (Yoon et al., "Federated Continual Learning with Weighted
Inter-client Transfer", ICML 2021, arXiv 2003.03196), task-incremental; the official code ``wyjeong/FedWeIT``
(TensorFlow 2) is the reference where the paper is silent (``docs/methods/fedweit.md``).

It trains FedWeIT's networks only (``cfl.models.fedweit_net``: models ``fedweit-mlp``, ``fedweit-lenet``) and
keeps every parameter but the layers' bases on its clients (``param_roles``' ``local``, the engine's per-client
parameters: the sequential path). Per client, while it learns task ``t``:
- round start (``client_start``): at a new task, the finished task's knowledge sum folded into ``kb_mix``
  (``cfl.models.fedweit_weight.fold_knowledge``), the stored weights of the past tasks taken from the client's own
  base (the drift anchors), the server's knowledge base loaded into ``kb`` (the broadcast ``task_start``); every
  round the base is the global one where that is not 0, the client's own elsewhere (``merge_base``);
- every local step: cross-entropy on the task's head + the code's regularisers (``cfl.ops.fedweit_losses``);
- after training (``client_upload``): the base's output units above the code's threshold of the current mask
  (``client_sparsity``) sent, the rest zeroed; the server averages each unit over its senders
  (``server_aggregate``);
- task end: each participant sends its ``A^(t)`` pruned at ``|A| > lambda_l1``; the server stacks them into the
  next task's knowledge base (``kb_size`` slots: the clients per round, zero-padded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.base import ClientRoundStart, ClientStart, Method, ServerEvent
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.methods.traffic_hooks import ParamNames, ParamRoles, Payload, StackedUploads, TrainedClient
from cfl.methods.training_hooks import ClientEndContext, LossContext, LossTerms
from cfl.models.fedweit_net import FROZEN, SHARED
from cfl.models.fedweit_weight import fold_knowledge, hard_threshold
from cfl.ops import fedweit_sparse as sparse
from cfl.ops.fedweit_losses import RegulariserWeights, drift_anchors, regulariser
from cfl.ops.fedweit_order import own_anchors, regulariser_own
from cfl.tensors import Params, State


@dataclass(frozen=True)
class FedWeITHyperparams:
    lambda_l1: float = field(1e-3, "L1 weight on the task-adaptive parts, also their pruning threshold at "
                             "evaluation and upload (official code: 1e-3); at most 1, which already prunes "
                             "practically every task-adaptive weight", min=0.0, max=1.0)
    lambda_l2: float = field(100.0, "weight of the drift of past tasks' weights (official code: 100)",
                             min=0.0, max=WEIGHT_MAX)
    lambda_mask: float = field(0.0, "L1 weight on the current mask logits (official code: 0)", min=0.0, max=WEIGHT_MAX)
    wd: float = field(1e-4, "the method's own weight decay on A, the mask and (first task) the base; the run's "
                      "weight_decay must be 0 (official code: 1e-4); at most 1, a decay that halves the "
                      "weights in a few steps", min=0.0, max=1.0)
    client_sparsity: float = field(0.3, "share of each layer's output units whose base is not uploaded (official "
                                   "code: 0.3)", min=0.0, max=0.999)
    halved: bool = field(True, "TensorFlow's l2_loss (sum x^2 / 2) in the drift and decay, as the code; false: the "
                         "paper's squared norm")
    past_adaptive_trained: bool = field(False, "the drift also moves past tasks' A (the paper's dA); false: only the "
                                        "base, as the code")
    encoding: str = field("bitmap", "how sparse payloads are counted: bitmap (a bit per entry + nonzero values) or "
                          "coo (value + int32 index per nonzero)", choices=sparse.ENCODINGS)


class FedWeIT(Method):
    name: ClassVar[str] = "fedweit"
    about: ClassVar[str] = ("FedWeIT (Yoon et al., ICML 2021): decomposed weights, sparse base upload, attention over "
                            "other clients' task-adaptive parts; task-incremental")
    Hyperparams: ClassVar[type] = FedWeITHyperparams
    #: the knowledge base goes to each client once per task, with its first round of the task
    requires = Requires(models=("fedweit-mlp", "fedweit-lenet"), scenarios=("task",), scenarios_why="one head per task")
    #: the task-end participants send their own A; the final global model is of no use to them
    sends = Sends(server_events=("task_end",), broadcast={"task_start": ("kb",)}, client_events=("task_end",),
                  downloads_model_at_task_end=False)
    computes = Computes(losses=("extra",), starts=("params",))  # client_start: the starting parameters

    def __init__(self, hparams: FedWeITHyperparams, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        layers = getattr(run_info.model, "decomposed", None)
        if layers is None:
            raise ConfigError("method fedweit needs one of FedWeIT's networks (cfl.models.fedweit_net); the run's "
                              f"model is {type(run_info.model).__name__}")
        if run_info.scenario != "task":
            raise ConfigError(f"method fedweit is task-incremental (one head per task); this stream is "
                              f"{run_info.scenario}-incremental: set stream.scenario: task")
        self.layers: list[str] = list(layers())
        self.kb_size = next(iter(layers().values())).kb.shape[0]
        self.weights = RegulariserWeights(hparams.lambda_l1, hparams.lambda_l2, hparams.lambda_mask, hparams.wd,
                                          hparams.halved, hparams.past_adaptive_trained)
        self.task_end_clients = run_info.clients_per_round  # the code: the last round's clients send their A
        #: under a schedule the clients' past tasks are their own (cfl/ops/fedweit_order.py), not the stream's prefix
        self.own_order = run_info.schedule != "synchronous"

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:
        if cfg.weight_decay != 0:
            raise ConfigError(f"method fedweit decays its own parts (fedweit.wd, {hparams.wd}); set weight_decay: 0 "
                              f"(it is {cfg.weight_decay})")

    # ---- parameters kept per client ----
    def param_roles(self, ctx: ParamNames) -> ParamRoles:
        """Parameters each client keeps: every one but the layers' bases (heads included, as the code); parameters no
        optimiser step moves: the knowledge base and the folded sums."""
        return ParamRoles(local=[n for n in ctx.names if n.rsplit(".", 1)[-1] not in SHARED],
                          frozen=[n for n in ctx.names if n.rsplit(".", 1)[-1] in FROZEN])

    # ---- client hooks ----
    def client_start(self, ctx: ClientRoundStart) -> ClientStart:
        """The client's starting parameters of a round, from ``ctx.params``: the global bases with its own locals."""
        params, state, server, task = ctx.params, ctx.state, ctx.server, ctx.task
        out = dict(params)
        own = state.get("base", {})
        for p in self.layers:
            out[f"{p}.base"] = own.get(p, params[f"{p}.base"])
        if state.get("task") != task:
            out = self._begin_task(out, state, server, task)
        for p in self.layers:
            out[f"{p}.base"] = sparse.merge_base(out[f"{p}.base"], params[f"{p}.base"])
        return ClientStart(params=out)

    def _begin_task(self, params: Params, state: State, server: State, task: int) -> Params:
        previous = state.get("task")
        if previous is not None:
            for p in self.layers:
                params[f"{p}.kb_mix"], params[f"{p}.attention"] = fold_knowledge(
                    params[f"{p}.kb_mix"], params[f"{p}.attention"], params[f"{p}.kb"], previous)
        if self.own_order:  # the tasks this client has begun before, whatever their ids
            first = params[f"{self.layers[0]}.mask"]
            past = state.get("past", first.new_zeros(first.shape[0])).clone()
            if previous is not None:
                past[previous] = 1
            state["past"], state["anchors"] = past, own_anchors(params, self.layers, past)
        else:
            state["anchors"] = drift_anchors(params, self.layers, task)  # from the client's own base, as the code
        kb = server.get("kb", {})
        for p in self.layers:
            params[f"{p}.kb"] = kb[p].clone() if p in kb else torch.zeros_like(params[f"{p}.kb"])
        state["task"] = task
        return params

    def loss(self, ctx: LossContext) -> LossTerms:
        """The regularisers, the same for every sample (the engine's mean over real samples gives them once);
        the current task is the number of stored past tasks (a shape, so the code runs under ``vmap``)."""
        params, x, task, state = ctx.params, ctx.x, ctx.task, ctx.state
        anchors = state["anchors"]
        if self.own_order:
            now = (torch.arange(state["past"].shape[-1], device=x.device) == task[0]).to(x.dtype)
            return LossTerms(extra=x.new_ones(x.shape[0]) * regulariser_own(params, self.layers, now, state["past"],
                                                                            anchors, self.weights))
        current = anchors[self.layers[0]].shape[0]
        return LossTerms(extra=x.new_ones(x.shape[0]) * regulariser(params, self.layers, current, anchors,
                                                                    self.weights))

    def client_upload(self, ctx: TrainedClient) -> tuple[Params, Params]:
        """After a round's training: the sparse bases sent and each layer's kept output units; the client
        keeps its full trained base for its next merge."""
        params, state = ctx.params, ctx.state
        state["base"] = {p: params[f"{p}.base"].detach().clone() for p in self.layers}
        task, sent, keeps = state["task"], {}, {}
        for p in self.layers:
            keep = sparse.kept_units(params[f"{p}.mask"][task].detach().abs(), self.hparams.client_sparsity)
            sent[f"{p}.base"], keeps[f"{p}.base"] = sparse.sparse_base(params[f"{p}.base"].detach(), keep), keep
        return sent, keeps

    def client_end(self, ctx: ClientEndContext) -> State | None:
        """Task end: the client's own ``A`` of the task (``state["local"]``), pruned at ``lambda_l1``: its entry of
        the next knowledge base; a participant that has not trained the task sends nothing."""
        event, data, state = ctx.event, ctx.data, ctx.state
        if event != "task_end" or state.get("task") != data.task:
            return None
        local, task = state["local"], state["task"]
        return {"adaptive": {p: hard_threshold(local[f"{p}.adaptive"][task], self.hparams.lambda_l1)
                             for p in self.layers}}

    def count_bytes(self, ctx: Payload) -> int | None:
        """Bytes of one client's sparse bases (the kept rows and a bitmap of the units per layer), of a sparse
        payload: a task-end upload (one knowledge-base entry) or the knowledge base sent at a task start (every
        entry), each tensor element-sparse; and the upper bound of the clients' state: each client's local
        parameters and its own base (one model together), the past tasks' drift anchors (fewer than ``num_tasks``
        bases) and a few numbers."""
        if ctx.kind == "client_upload":
            return sum(sparse.row_sparse_bytes(ctx.info[n], ctx.sent[n][0].numel()) for n in ctx.sent)
        if ctx.kind == "client_state":
            bases = sum(layer.base.numel() * layer.base.element_size()
                        for layer in self.run_info.model.decomposed().values())
            return ctx.sizing.num_clients * (ctx.sizing.model_bytes + ctx.sizing.num_tasks * bases + 64)
        if ctx.kind == "task_end_upload":
            return sparse.knowledge_base_bytes([ctx.payload["adaptive"]], self.hparams.encoding)
        if ctx.kind != "task_start":
            return None
        kb = ctx.payload.get("kb", {})
        entries = [{p: kb[p][k] for p in kb} for k in range(self.kb_size)] if kb else []
        return sparse.knowledge_base_bytes(entries, self.hparams.encoding)

    # ---- server ----
    def server_aggregate(self, ctx: StackedUploads) -> Params:
        """The new global bases from the clients' stacked uploads ``(C, ...)``: each output unit the mean
        over the clients that sent it (unweighted, as the code), 0 where none did."""
        return {n: sparse.aggregate_bases(ctx.sent[n], ctx.info[n]) for n in ctx.sent}

    def server_event(self, ctx: ServerEvent) -> None:
        """Task end: the knowledge base of the next task, the entries in client-id order, ``kb_size`` slots
        (zero-padded; the code's order is its threads' finishing order). Under a schedule other than the
        synchronous one, after each round at which drawn clients leave a task: their entries first, then the
        newest of the previous knowledge base (``kb_entries`` of them are real), ``kb_size`` in all."""
        if not ctx.uploads:
            return
        entries = [ctx.uploads[c]["adaptive"] for c in sorted(ctx.uploads)]
        if self.run_info.schedule != "synchronous":  # clients end tasks at their own rounds: the newest entries
            kb, kept = ctx.server.get("kb", {}), int(ctx.server.get("kb_entries", 0))
            entries += [{p: kb[p][k] for p in self.layers} for k in range(kept)]
            ctx.server["kb_entries"] = min(len(entries), self.kb_size)
        entries = entries[: self.kb_size]
        kb = {}
        for p in self.layers:
            stacked = torch.stack([e[p] for e in entries])
            pad = stacked.new_zeros(self.kb_size - len(entries), *stacked.shape[1:])
            kb[p] = torch.cat([stacked, pad])
        ctx.server["kb"] = kb

