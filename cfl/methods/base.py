"""The method plugin interface: nineteen optional hooks, written for ONE client, seven more for parameters kept
per client (FedWeIT: ``local_params`` ... ``payload_bytes``), and three declarations (``requires``, ``sends``,
``computes``: cfl/methods/declarations.py).

A method is a small class with a ``Hyperparams`` dataclass and whichever hooks it overrides (the engine
detects them by override). Client hooks see one client's state (a nested dict) and return one client's
figures; the engine batches clients, stacks and pads their states and chooses its training path once per
run (``docs/plugins.md``). State is owned by the engine (:class:`cfl.records.client_states.MethodState`),
checkpointed with the run, and handed back to the hooks of the method that made it.

A round (``t`` = task, 0-based): each client takes its batches (each epoch cut to ``local_steps_per_epoch``
where a method sets it); every local step's loss is the cross-entropy (or the method's ``task_loss``)
plus the ``penalty`` quadratics, the ``extra_loss`` and the
``replay`` samples to the loss; the step hooks (``step_samples``, ``step_gradient``, ``carry_start``,
``carry_step``: :class:`Step`) see and may rewrite each step's gradient and keep running values through the
round; the optimiser projects the gradients off ``gradient_projection`` and steps; after training,
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

from cfl.methods.declarations import (
    BROADCAST_EVENTS,
    DECLARATIONS,
    Computes,
    Requires,
    Sends,
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
from cfl.methods.old_interface import old_hooks_message, old_names_message
from cfl.methods.server_hooks import (
    SERVER_EVENTS,
    ServerChange,
    ServerEvent,
    ServerMoment,
    ServerUpdate,
    TransformUpdate,
)
from cfl.methods.traffic_hooks import ParamNames, ParamRoles, Payload, StackedUploads, TrainedClient
from cfl.ops.losses import masked_cross_entropy
from cfl.schema import ConfigError
from cfl.tensors import Params, State

__all__ = [
    # the interface, and what the engine asks of a method's class (at the end of this file)
    "Method", "overrides", "PER_CLIENT_HOOKS", "per_client_hooks", "takes_part_at_task_end", "acts_after_rounds",
    # handed on: the values the hooks receive and return (cfl/methods/hook_types.py)
    "Event", "EVENTS", "NoHyperparams", "Quadratic", "BackboneUpdate", "Linear", "Samples", "Step", "LocalTraining",
    "RunInfo", "StateSizing", "ClientData",
    # handed on: a method's declarations and their checks (cfl/methods/declarations.py) and the check of which
    # arguments its hooks take (cfl/methods/hook_signatures.py)
    "Requires", "Sends", "Computes", "BROADCAST_EVENTS", "refuse_model_without_running_stats", "refuse_scenario",
    "accepts",
    # handed on: the server hooks' values (cfl/methods/server_hooks.py)
    "ServerMoment", "SERVER_EVENTS", "ServerEvent", "ServerChange", "ServerUpdate", "TransformUpdate",
    # handed on: the contexts of the traffic and parameter-role hooks (cfl/methods/traffic_hooks.py, with the kinds
    # ``count_bytes`` counts: PayloadKind)
    "ParamNames", "ParamRoles", "TrainedClient", "StackedUploads", "Payload",
    # handed on: the tensor types of the hooks (cfl/tensors.py)
    "Params", "State",
]


class Method:
    """Base class: every hook is optional and defaults to doing nothing (FedAvg)."""

    name: ClassVar[str] = "base"
    about: ClassVar[str] = ""
    Hyperparams: ClassVar[type] = NoHyperparams
    #: the declarations (cfl/methods/declarations.py): what the method requires of the run, what it sends and when,
    #: how its client states batch
    requires: ClassVar[Requires] = Requires()
    sends: ClassVar[Sends] = Sends()
    computes: ClassVar[Computes] = Computes()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        old = old_names_message(cls, Method) or old_hooks_message(cls, Method)
        if old:
            raise ConfigError(old)
        for attr, kind in DECLARATIONS.items():
            value = getattr(cls, attr)
            if not isinstance(value, kind):
                raise TypeError(f"{cls.__name__}.{attr} is {value!r}; declare {attr} = {kind.__name__}(...)")
        if cls.sends.changes_backbone and cls.requires.schedules != ("synchronous",):
            raise TypeError(f"{cls.__name__} declares sends=Sends(changes_backbone=True), which its "
                            "server_event('task_end') may do at the synchronous schedule's task ends only: declare "
                            "requires = Requires(schedules=('synchronous',), schedules_why=...)")

    def __init__(self, hparams: Any, run_info: RunInfo) -> None:
        if self.requires.scenarios:  # checked here too (a method built directly, a stream whose scenario was auto)
            refuse_scenario(type(self), run_info.scenario)
        if self.requires.running_stats_model:
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
    def param_roles(self, ctx: ParamNames) -> ParamRoles:
        """The roles of some of the model's parameters (``ctx.names``). ``local``: those each client keeps as its
        own: the engine keeps them in the client's state (``state["local"]``), loads them at its round start (the
        template's values at its first round), writes the trained values back after training (before
        ``client_end``), and leaves them out of the aggregation and out of the model bytes. ``frozen``: those no
        optimiser step moves (no gradient, weight decay or optimiser state), e.g. values a hook fills in (FedWeIT's
        knowledge base). Overriding it sends the run to the sequential path."""
        return ParamRoles()

    def client_start(self, params: Params, state: State, server: State, task: int) -> Params:
        """A client's starting parameters of a round (per client, outside ``vmap``, before its local training):
        ``params`` is the global model with the client's local parameters; ``state`` may be updated in place
        (the training hooks see it). Returns every parameter, shaped as ``params``."""
        return params

    def client_upload(self, ctx: TrainedClient) -> tuple[Params, Params]:
        """After a round's training (``ctx.params``: the client's trained model, ``ctx.state`` its state): what it
        sends of the shared parameters (``sent``: names of parameters, each shaped like it) and what the server
        needs to combine them (``info``: tensors); the parameters in ``sent`` are combined by ``server_aggregate``
        in place of the weighted mean. Defaults to nothing: every shared parameter averaged."""
        return {}, {}

    def server_aggregate(self, ctx: StackedUploads) -> Params:
        """The new global values of the parameters in ``ctx.sent`` from the round's kept clients' uploads, stacked
        ``(C, ...)`` (``client_upload``); the server steps to them (``server_lr`` 1: exactly them)."""
        return {k: v.mean(0) for k, v in ctx.sent.items()}

    def count_bytes(self, ctx: Payload) -> int | None:
        """Bytes of what ``ctx.kind`` names (:data:`PayloadKind`): one client's ``client_upload`` (``ctx.sent``,
        ``ctx.info``), one client's ``client_end`` upload or copy of a broadcast (``ctx.payload``), or the estimate
        of the state of all clients together at its largest in the run (``"client_state"``, from ``ctx.sizing``:
        an upper bound where it can be one; ``client_state_store: auto`` and the disk-space check use it before
        the run starts, docs/scaling.md). None: the default, the dense bytes (of ``sent``; of every tensor of
        ``payload``) or, for ``"client_state"``, 0 for a method that keeps no client state (overrides neither
        ``client_end`` nor ``param_roles``/``client_start``/``client_upload``/``server_aggregate``) and no
        estimate otherwise (kept in memory under ``auto``, with a line on stderr)."""
        return None

    # ---- client side, one client ----
    def penalty(self, global_params: Params, server: State, state: State) -> dict[str, Quadratic | Linear] | None:
        """Quadratic and linear penalties added to every local step's loss, per parameter name (others carry none)."""
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

    def layer_preconditioner(self, state: State) -> dict[str, torch.Tensor]:
        """Per parameter, a matrix ``P (d, d)`` that multiplies every local step's gradient on the right on the
        im2col view, ``g <- g P`` (RGO's ``P~``), after the step hooks and before weight decay; the stacked path
        applies it to a fused layer's inputs instead (``delta^T (X P)``: cheaper where the batch is smaller than
        the layer's output). Called once per round per client."""
        return {}

    def gradient_projection(self, state: State) -> dict[str, torch.Tensor]:
        """Per parameter, an orthonormal basis ``(d, k)`` of the layer-input directions its local gradients
        must not move along (GPM): ``g <- g - (g M) M^T`` on the im2col view, after weight decay."""
        return {}

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

    def carry_start(self, global_params: Params, state: State) -> State:
        """The running values a client starts a round's local training with (e.g. SI's path integral so far):
        tensors of fixed shapes. At the round's end the client's state takes the final ones (``state.update``)
        before ``client_end("round")``."""
        return {}

    def carry_step(self, step: Step, moved: Params) -> State:
        """The running values after the step: ``moved`` is ``new params - step.params`` (the optimiser's actual
        update); returns a dict shaped like ``step.carry`` (SI: ``path += -grad * moved``)."""
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

    def local_steps_per_epoch(self, num_samples: int, server: State) -> int | None:
        """At most this many local steps in each epoch of a client holding ``num_samples`` samples of the task (its
        first batches of the epoch's shuffle), with ``server`` the round's broadcast; None: all its batches
        (TARGET's code zips the real and the synthetic loaders, so an epoch stops at the shorter). Called once per
        client and round; with several methods the smallest count applies."""
        return None

    # ---- server side ----
    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        """The server's moments the method declares in ``server_events`` (:class:`ServerEvent`; ``ctx.server``
        changed in place). "start": once, before the first round (not again on resume: the server state is
        checkpointed), create the server state the first broadcast sends (SCAFFOLD's ``c``; a broadcast key missing
        from it is not sent). "round": after each round's server step, reduce the round's uploads and look at the
        new global model (GLFC's proxy server scores it); may return new global values of some parameters
        (a closed-form classifier: fedncm, afcl). "before_task_end": at the end of every task but the last, before
        the task-end broadcast is sent and before ``client_end("task_end")``, on the task's final global model
        (train a generator, keep a synthetic pool or the old model for the next task's ``"task_start"``
        broadcast); must return None; its wall time adds to ``server["stats"]``'s ``before_task_end_seconds``.
        "task_end": reduce the task-end uploads (``server_task_end``: when); may return new global values and, for
        a method declaring ``changes_backbone`` (synchronous schedule only), a change of the SHARED frozen backbone
        of a pretrained model (``model.train: prompts | components | lora``; never with the feature cache), e.g.
        merge what trained into it (LoRM); the engine says each change on stderr and in ``results.json``
        (``backbone_changes``), checkpoints the changed tensors and counts them once in each client's download at
        its next round. ``ctx.global_params`` is never written into in place. Across a run's methods each moment
        runs per method in the order of ``method`` then ``plugins``."""
        return None

    def server_update(self, ctx: ServerUpdate) -> Params | None:
        """Apply the update (server optimisers such as FedAdam); None: the default ``w + lr * delta``."""
        return None

    def transform_update(self, ctx: TransformUpdate) -> Params:
        """Rewrite the server step ``w_new - w`` before it is applied (FOT's projection). It runs last: after
        aggregation, the server optimiser and GMA's mask, so a projection constrains the step taken."""
        return ctx.delta


def overrides(method: Method, hook: str) -> bool:
    """Whether ``method``'s class replaces the base class's ``hook``."""
    return getattr(type(method), hook) is not getattr(Method, hook)


#: the hooks of parameters kept per client: a method overriding any trains on the sequential path
PER_CLIENT_HOOKS = ("param_roles", "client_start", "client_upload", "server_aggregate")


def per_client_hooks(cls: type[Method]) -> list[str]:
    """The hooks of parameters kept per client that the method class ``cls`` overrides."""
    return [h for h in PER_CLIENT_HOOKS if getattr(cls, h) is not getattr(Method, h)]


def takes_part_at_task_end(method: Method) -> bool:
    """Whether any client runs ``client_end("task_end")`` for ``method``."""
    return overrides(method, "client_end") and "task_end" in method.sends.client_events and method.task_end_clients != 0


def acts_after_rounds(method: Method) -> bool:
    """Whether the round's kept clients run ``client_end("round")`` for ``method``."""
    return overrides(method, "client_end") and "round" in method.sends.client_events
