"""The method plugin interface: nineteen optional hooks, written for ONE client, seven more for parameters kept
per client (FedWeIT: ``local_params`` ... ``payload_bytes``), and a few declarations.

A method is a small class with a ``Hyperparams`` dataclass and whichever hooks it overrides (the engine
detects them by override). Client hooks see one client's state (a nested dict) and return one client's
figures; the engine batches clients, stacks and pads their states and chooses its training path once per
run (``docs/plugins.md``). State is owned by the engine (:class:`cfl.records.client_states.MethodState`),
checkpointed with the run, and handed back to the hooks of the method that made it.

A round (``t`` = task, 0-based): each client takes its batches (each epoch cut to ``client_start``'s ``steps``
where a method gives it); every local step's loss is the cross-entropy (or the method's ``task_loss``)
plus ``round_terms``' ``penalty`` quadratics, the ``extra_loss`` and the
``replay`` samples to the loss; the step hooks (``step_samples``, ``step_gradient``, ``client_start``'s
``carry``, ``carry_step``: :class:`Step`) see and may rewrite each step's gradient and keep running values through the
round; the optimiser projects the gradients off ``round_terms``' ``projection`` and steps; after training,
``client_end("round")`` on each client, then the server aggregates, applies ``server_update`` (x GMA mask)
and ``transform_update``, ``server_end("round")`` reduces the clients' uploads and ``after_server_step`` sees
the new global model. At a task end,
``before_task_end`` on the server (the task's final global model; e.g. training a generator), then
``client_end("task_end")`` on the participants (``task_end_clients``), ``server_end("task_end")`` and
``backbone_update`` (a change of the shared frozen backbone: LoRM's merge).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from cfl.methods.client_hooks import (
    ClientRound,
    ClientRoundStart,
    ClientStart,
    RoundTerms,
    StartPart,
    TermPart,
    check_parts,
    provides,
)
from cfl.methods.declaration_checks import (
    BROADCAST_EVENTS,
    check_broadcast,
    refuse_model_without_running_stats,
    refuse_scenario,
)
from cfl.methods.hook_signatures import accepts
from cfl.methods.hook_types import (
    EVENTS,
    BackboneUpdate,
    ClientData,
    Event,
    Linear,
    LocalTraining,
    NoHyperparams,
    Quadratic,
    RunInfo,
    Samples,
    StateSizing,
    Step,
)
from cfl.ops.losses import masked_cross_entropy
from cfl.tensors import Params, State

__all__ = [
    # the interface, and what the engine asks of a method's class (at the end of this file)
    "Method", "overrides", "PER_CLIENT_HOOKS", "per_client_hooks", "takes_part_at_task_end", "acts_after_rounds",
    # handed on: the values the hooks receive and return (cfl/methods/hook_types.py)
    "Event", "EVENTS", "NoHyperparams", "Quadratic", "BackboneUpdate", "Linear", "Samples", "Step", "LocalTraining",
    "RunInfo", "StateSizing", "ClientData",
    # handed on: a client's round start and round terms (cfl/methods/client_hooks.py)
    "ClientRoundStart", "ClientStart", "StartPart", "ClientRound", "RoundTerms", "TermPart", "provides",
    # handed on: the checks of a method's declarations (cfl/methods/declaration_checks.py) and of which arguments
    # its hooks take (cfl/methods/hook_signatures.py)
    "BROADCAST_EVENTS", "check_broadcast", "refuse_model_without_running_stats", "refuse_scenario", "accepts",
    # handed on: the tensor types of the hooks (cfl/tensors.py)
    "Params", "State",
]


class Method:
    """Base class: every hook is optional and defaults to doing nothing (FedAvg)."""

    name: ClassVar[str] = "base"
    about: ClassVar[str] = ""
    Hyperparams: ClassVar[type] = NoHyperparams
    #: server-state keys sent to the clients, per event ("round": with the model each round; "task_start": to a
    #: client at its first sampled round of each task, once, and the client's hooks see them in all of the task's
    #: rounds; "task_end": to the task-end participants); counted as download bytes
    broadcast: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: client-state tensors whose size differs between clients: key (a nested key's dotted path, or the
    #: path of a dict holding them) -> dim; the engine zero-pads that dim to the widest client
    ragged: ClassVar[dict[str, int]] = {}
    #: whether the task-end participants download the task's final global model (counted in
    #: ``download_bytes`` and on the line ``method_stats.<name>.task_end_model_download_bytes``)
    downloads_model_at_task_end: ClassVar[bool] = True
    #: the events whose ``client_end`` the method acts on; the engine calls it for those only (a method that
    #: acts at task ends only costs its rounds nothing: no state read, no call per client)
    client_events: ClassVar[tuple[Event, ...]] = ("round", "task_end")
    #: why the method's hooks cannot run under ``torch.func.vmap`` (e.g. a step hook that calls a solver outside
    #: torch), or "": a non-empty reason sends the run to the sequential path, said on stderr
    sequential_reason: ClassVar[str] = ""
    #: top-level config keys the method makes unread -> why (a run setting one away from its default is refused,
    #: cfl/ignored_keys.py), e.g. an adaptive server's ``{"server_lr": "..."}``
    unread_keys: ClassVar[dict[str, str]] = {}
    #: the models only this method can train (a model family of its own, e.g. FedWeIT's decomposed networks): the
    #: run's model must be one of them, and no other method may train them (refused when the config is validated)
    models: ClassVar[tuple[str, ...]] = ()
    #: a model with BatchNorm running statistics, for a method that reads them (TARGET's and MFCL's synthesis match
    #: them): the run's model must keep running statistics (refused when the config is validated); ``model.name:
    #: auto`` is it
    running_stats_model: ClassVar[str] = ""
    #: the method trains a classifier on a frozen pretrained backbone's features (docs/pretrained.md): the run's
    #: model must be a backbone (refused when the config is validated)
    backbone_only: ClassVar[bool] = False
    #: the ``model.train`` a backbone method needs (``head``: cached features; ``prompts``, ``lora``: its adapter;
    #: "": any), refused otherwise when the config is validated (cfl/pretrained/loaded.py)
    model_train: ClassVar[str] = ""
    #: the scenarios the method runs in (empty: every one), and why (a clause for the refusal): a run in another is
    #: refused when the config is validated (``auto``: the stream's default) and when the method is built
    scenarios: ClassVar[tuple[str, ...]] = ()
    scenarios_why: ClassVar[str] = ""
    #: the schedules (``schedule.name``, cfl/schedules.py) the method runs under (empty: every one), and why (a
    #: clause for the refusal): a run under another is refused when the config is validated
    schedules: ClassVar[tuple[str, ...]] = ()
    schedules_why: ClassVar[str] = ""
    #: under a schedule other than the synchronous one, when ``server_end("task_end", uploads, task)`` runs: "switch"
    #: after each round at which clients leave ``task``, with their uploads; "last_holder": once, when the task's
    #: last holder has left it (after ``before_task_end``), with every upload held since the clients' own task ends
    #: (cfl/engine/task_end.py)
    server_task_end: ClassVar[str] = "switch"
    #: the parts of ``client_start`` the method gives (cfl/methods/client_hooks.py), each asked at its moment
    starts: ClassVar[tuple[StartPart, ...]] = ()
    #: the parts of ``round_terms`` the method gives, each asked where the engine uses it
    terms: ClassVar[tuple[TermPart, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = [e for e in cls.client_events if e not in EVENTS]
        if unknown:
            raise TypeError(f"{cls.__name__}.client_events lists {unknown}; the events are {list(EVENTS)}")
        check_broadcast(cls)
        check_parts(cls, Method)
        if cls.backbone_update is not Method.backbone_update and tuple(cls.schedules) != ("synchronous",):
            raise TypeError(f"{cls.__name__} overrides backbone_update, which runs at the synchronous schedule's task "
                            "ends only: declare schedules = ('synchronous',) and say why in schedules_why")
        if cls.server_task_end not in ("switch", "last_holder"):
            raise TypeError(f"{cls.__name__}.server_task_end is {cls.server_task_end!r}; it is 'switch' or "
                            "'last_holder'")

    def __init__(self, hparams: Any, run_info: RunInfo) -> None:
        if self.scenarios:  # declared: checked here too (a method built directly, a stream whose scenario was auto)
            refuse_scenario(type(self), run_info.scenario)
        if self.running_stats_model:
            refuse_model_without_running_stats(type(self), run_info.model)
        self.hparams = hparams
        self.run_info = run_info
        #: clients that run ``client_end("task_end")``: None all of them, else that many sampled ones (0: none)
        self.task_end_clients: int | None = None

    @classmethod
    def check(cls, hparams: Any, cfg: Any) -> None:
        """Raise ``ConfigError`` if ``hparams`` cannot work with the run config ``cfg``; called when the config
        is validated, before any file is written or data loaded."""

    # ---- parameters kept per client (docs/plugins.md, "Parameters kept per client") ----
    def local_params(self, names: list[str]) -> list[str]:
        """The parameters (of the model's ``names``) each client keeps as its own: the engine keeps them in the
        client's state (``state["local"]``), loads them at its round start (the template's values at its first
        round), writes the trained values back after training (before ``client_end``), and leaves them out of
        the aggregation and out of the model bytes. Declaring any sends the run to the sequential path."""
        return []

    def frozen_params(self, names: list[str]) -> list[str]:
        """The parameters no optimiser step moves (no gradient, weight decay or optimiser state), e.g. values a
        hook fills in (FedWeIT's knowledge base)."""
        return []

    def client_start(self, ctx: ClientRoundStart) -> ClientStart | None:
        """A client's round start, per client, outside ``vmap``, asked once per part the class declares in
        ``starts``, at the part's moment (``ctx.part``; :class:`ClientStart`'s field of it is taken): ``steps``
        (when the round's jobs are made: at most this many local steps in each epoch of a client holding
        ``ctx.num_samples`` samples, its first batches of the epoch's shuffle; TARGET's code zips the real and the
        synthetic loaders; with several methods the smallest count applies); ``params`` (the sequential trainer's
        starting parameters: ``ctx.params`` is the global model with the client's local parameters;
        ``ctx.state`` may be updated in place, the training hooks see it; every parameter, shaped as
        ``ctx.params``; declaring it sends the run to the sequential path); ``carry`` (the running values the
        step hooks start the round's local training with, e.g. SI's path integral so far: tensors of fixed
        shapes; at the round's end the client's state takes the final ones, ``state.update``, before
        ``client_end("round")``)."""
        return None

    def client_upload(self, params: Params, state: State) -> tuple[Params, Params]:
        """After a round's training (``params``: the client's trained model): what it sends of the shared
        parameters (``sent``: names of parameters, each shaped like it) and what the server needs to combine
        them (``info``: tensors); the parameters in ``sent`` are combined by ``server_aggregate`` in place of
        the weighted mean. Defaults to nothing: every shared parameter averaged."""
        return {}, {}

    def server_aggregate(self, sent: Params, info: Params) -> Params:
        """The new global values of the parameters in ``sent`` from the round's kept clients' uploads, stacked
        ``(C, ...)`` (``client_upload``); the server steps to them (``server_lr`` 1: exactly them)."""
        return {k: v.mean(0) for k, v in sent.items()}

    def upload_bytes(self, sent: Params, info: Params) -> int:
        """Bytes of one client's ``client_upload`` (one client's ``sent`` and ``info``), in place of the dense
        bytes of those parameters."""
        return sum(v.numel() * v.element_size() for v in sent.values())

    def payload_bytes(self, event: str, payload: State) -> int | None:
        """Bytes of a payload: ``event`` "task_end" (one client's task-end upload) or "task_start" / "round" /
        "task_end_broadcast" (a broadcast, one client's copy); None: its dense size (every tensor's bytes)."""
        return None

    # ---- client side, one client ----
    def round_terms(self, ctx: ClientRound) -> RoundTerms | None:
        """One client's constants of a round, per part the class declares in ``terms`` (``ctx.part``: the one the
        engine takes; :class:`RoundTerms`). ``penalty``: Quadratic and Linear terms added to every local step's
        loss, per parameter name (others carry none). ``preconditioner``: per weight a matrix ``P (d, d)`` that
        multiplies every local step's gradient on the right on the im2col view, ``g <- g P`` (RGO's ``P~``),
        after the step hooks and before weight decay; the stacked path applies it to a fused layer's inputs
        instead (``delta^T (X P)``), once per round per client. ``projection``: per parameter an orthonormal
        basis ``(d, k)`` of the layer-input directions its local gradients must not move along (GPM): ``g <- g -
        (g M) M^T`` on the im2col view, after weight decay. Run under ``vmap`` over the clients: a pure tensor
        function of ``ctx.state``; the engine may ask a part once per step."""
        return None

    def task_loss(self, params: Params, logits: torch.Tensor, y: torch.Tensor, x: torch.Tensor, task: torch.Tensor,
                  weight: torch.Tensor, allowed: torch.Tensor | None, server: State, state: State) -> torch.Tensor:
        """Per-sample loss ``(B,)`` in place of the cross-entropy (GLFC's gradient compensation): ``logits``
        ``(B, K)`` of the step's batch ``x`` (replay included) at ``params``, labels ``y``, ``weight`` 0 for
        padding, ``allowed`` ``(K,)`` the classes the loss may use (class-incremental: those seen) or None. The
        engine averages it over the real samples; the run's ``train_loss`` is its mean. One method of a run at
        most; a pure tensor function (``vmap``)."""
        return masked_cross_entropy(logits, y, allowed)

    def extra_loss(self, params: Params, x: torch.Tensor, task: torch.Tensor, server: State,
                   state: State, samples: Samples | None = None) -> torch.Tensor:
        """Per-sample extra loss ``(B,)`` of the step's batch ``x`` (distillation, e.g. LwF); the engine averages
        it over the real samples. A pure tensor function of ``params``. The engine calls it only where a method
        overrides it (an override sends the run to the vmap path, said on stderr).

        ``samples``: this method's ``step_samples`` draw of the step (``weight`` 0 marks padding) or None; the
        engine passes it only to an override that names the argument. A loss on them needs a forward of its
        own (``functional_call(self.run_info.model, params, (samples.x, samples.task))``); a batch-mean term
        (TARGET's KD on a synthetic batch) is added to every entry, so the mean over the real samples keeps it.
        ``weight`` (``(B,)``, 0 on padding), passed only to an override that names it, lets a batch term sum over
        the real samples (Fed-CPrompt's triplet on the batch sum)."""
        return x.new_zeros(x.shape[0])

    def replay(self, state: State, generator: torch.Generator, server: State | None = None) -> Samples | None:
        """Extra samples appended to every local step's batch and trained on in its forward (ER's memory, MFCL's
        synthetic images); ``generator`` is the client's own; ``server``: the method's broadcast of the round
        (``"task_start"`` keys included), passed only to an override that names the argument."""
        return None

    # ---- step hooks, one client (see :class:`Step`) ----
    def step_samples(self, state: State, generator: torch.Generator, server: State | None = None,
                     carry: State | None = None) -> Samples | None:
        """Samples drawn for this step's hooks and not trained on (A-GEM's reference batch, a synthetic batch from a
        broadcast generator or pool), as ``step.samples`` and ``extra_loss``'s ``samples``; ``generator`` is the
        client's own (the one ``replay`` draws from), drawn after ``replay``'s draw and before the step's loss;
        ``server``: the method's broadcast of the round; ``carry``: the client's running values before this step
        (a memory filled during the round, DER++); each passed only to an override that names the argument."""
        return None

    def step_gradient(self, step: Step) -> Params | None:
        """The step's gradient rewritten (A-GEM's projection, RGO's preconditioner): every parameter of
        ``step.grads``, same shapes; None keeps it. The optimiser then takes it (decay, projection, moments)."""
        return None

    def carry_step(self, step: Step) -> State:
        """The running values after the step: ``step.moved`` is ``new params - step.params`` (the optimiser's
        actual update); returns a dict shaped like ``step.carry`` (SI: ``path += -grad * moved``)."""
        return step.carry

    def client_end(self, event: Event, model: nn.Module, params: Params, data: ClientData, state: State,
                   server: State, generator: torch.Generator,
                   training: LocalTraining | None = None) -> State | None:
        """After a round's local training (``params``: the client's trained model) or at a task end (the final
        global model): update ``state`` in place and return what the client uploads (counted), or None.
        ``training`` (passed only to an override that names it): at a round's end, the round's global model, the
        client's local steps and the learning rate (:class:`LocalTraining`); None at a task end.

        ``params`` of a round are views of the round's stacked client models, whose memory the server
        reuses afterwards: keep computed tensors or ``.clone()``, never the views themselves."""
        return None

    def client_state_bytes(self, sizing: StateSizing) -> int | None:
        """Estimated bytes of the state of all clients together at its largest in the run (an upper bound where
        it can be one): ``client_state_store: auto`` and the disk-space check use it before the run starts
        (docs/scaling.md). A method that does not override ``client_end`` keeps no client state (0); one that
        does, or keeps parameters per client, and gives no estimate (None) is kept in memory under ``auto``, with a
        line on stderr."""
        return None if overrides(self, "client_end") or per_client_hooks(type(self)) else 0

    # ---- server side ----
    def server_start(self, server: State, global_params: Params) -> None:
        """Once, before the first round (not again on resume: the server state is checkpointed): create the server
        state the first broadcast sends (SCAFFOLD's ``c``), in place; ``global_params`` is the initial model. A
        broadcast key missing from the server state is not sent (the hooks see no such key)."""

    def before_task_end(self, model: nn.Module, classes: torch.Tensor, server: State, task: int) -> None:
        """At the end of every task but the last, before the task-end broadcast is sent and before
        ``client_end("task_end")``: ``model`` is the task's final global model (a copy of the template holding the
        global parameters, in eval mode; the method may keep or change it), ``classes`` the class ids seen in tasks
        ``0..task`` (long, sorted). Update ``server`` in place (a generator, a synthetic pool, the old model for
        the next task's ``"task_start"`` broadcast). Its wall time adds to ``server["stats"]``'s
        ``before_task_end_seconds``."""

    def server_end(self, event: Event, uploads: dict[int, State], server: State, task: int) -> None:
        """Reduce the clients' uploads of a round or a task end into the server state."""

    def server_update(self, global_params: Params, delta: Params, server: State, server_lr: float) -> Params | None:
        """Apply the update (server optimisers such as FedAdam); None: the default ``w + lr * delta``."""
        return None

    def after_server_step(self, model: nn.Module, global_params: Params, server: State, task: int) -> Params | None:
        """After each round's server step and ``server_end("round")``: look at the new global model (``model``, the
        template, in eval mode) and update ``server`` in place (GLFC's proxy server scores it). May return new
        global values of some parameters (``{name: tensor}``, each shaped like it), set from the server state
        that ``server_end`` has just reduced: a closed-form classifier (fedncm, afcl); None: unchanged."""
        return None

    def backbone_update(self, model: nn.Module, global_params: Params, server: State,
                        task: int) -> BackboneUpdate | None:
        """At the end of every task but the last, after ``server_end("task_end")``: change the SHARED frozen
        backbone of a pretrained model (``model.train: prompts | components | lora``, whose frozen weights are
        buffers), e.g. merge what trained into it (LoRM). ``model`` is a copy of the task's final global model (in
        eval mode). Synchronous schedule only (a class that overrides it must declare ``schedules =
        ("synchronous",)``: under the others clients hold different tasks and one backbone cannot serve both);
        never with the feature cache (refused when the config is validated). The engine says each change on stderr
        and in ``results.json`` (``backbone_changes``), checkpoints the changed tensors, and counts them once in
        the download of each client at its next round. None: unchanged."""
        return None

    def transform_update(self, delta: Params, server: State, task: int) -> Params:
        """Rewrite the server step ``w_new - w`` before it is applied (FOT's projection). It runs last: after
        aggregation, the server optimiser and GMA's mask, so a projection constrains the step taken."""
        return delta


def overrides(method: Method, hook: str) -> bool:
    """Whether ``method``'s class replaces the base class's ``hook``."""
    return getattr(type(method), hook) is not getattr(Method, hook)


#: the hooks of parameters kept per client: a method overriding any trains on the sequential path
PER_CLIENT_HOOKS = ("local_params", "frozen_params", "client_start", "client_upload", "server_aggregate")


def per_client_hooks(cls: type[Method]) -> list[str]:
    """The hooks of parameters kept per client that the method class ``cls`` overrides."""
    return [h for h in PER_CLIENT_HOOKS if getattr(cls, h) is not getattr(Method, h)
            and (h != "client_start" or provides(cls, "params"))]


def takes_part_at_task_end(method: Method) -> bool:
    """Whether any client runs ``client_end("task_end")`` for ``method``."""
    return overrides(method, "client_end") and "task_end" in method.client_events and method.task_end_clients != 0


def acts_after_rounds(method: Method) -> bool:
    """Whether the round's kept clients run ``client_end("round")`` for ``method``."""
    return overrides(method, "client_end") and "round" in method.client_events
