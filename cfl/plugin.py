"""Every name a plugin file uses, in one import: ``from cfl.plugin import Method, Quadratic, register, ...``.

A method plugin subclasses :class:`Method` (the hooks and their arguments: ``docs/plugins.md``), declares what it
requires, sends and how it batches (:class:`Requires`, :class:`Sends`, :class:`Computes`) and registers it with
``@register`` (a classifier set in closed form on a backbone's cached features subclasses :class:`ClosedFormHead`
and gives two functions); a stream plugin registers a builder with :func:`register_stream` (``docs/own-dataset.md``);
models, partitioners, aggregators and losses are registered on their registries (``MODELS.register(name,
builder)``). This module only hands names on: the interface lives in :mod:`cfl.methods.base`, the values
its hooks receive and return in :mod:`cfl.methods.hook_types`, the registries with what they hold. It imports no
engine code, so a plugin file stays cheap to load (``cfl list``, the Ray and ``--jobs`` workers import it too).
``cfl.plugin_files`` is something else: the loader of ``--plugin`` files.
"""

from __future__ import annotations

from cfl.config.schema import ConfigError, field
from cfl.data.derive import permuted_tasks, split_tasks
from cfl.data.partition import PARTITIONERS
from cfl.data.stream import Stream, Task
from cfl.methods import METHODS, register
from cfl.methods.base import Method
from cfl.methods.client_hooks import ClientRound, ClientRoundStart, ClientStart, RoundTerms, StartPart, TermPart
from cfl.methods.closed_form import ClosedFormHead
from cfl.methods.declarations import BroadcastEvent, Computes, ModelTrain, Requires, Scenario, Sends, ServerTaskEnd
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
from cfl.methods.server_hooks import (
    SERVER_EVENTS,
    ServerChange,
    ServerEvent,
    ServerMoment,
    ServerUpdate,
    TransformUpdate,
)
from cfl.methods.traffic_hooks import (
    PAYLOAD_KINDS,
    ParamNames,
    ParamRoles,
    Payload,
    PayloadKind,
    StackedUploads,
    TrainedClient,
)
from cfl.methods.training_hooks import ClientEndContext, Draw, LossContext, LossTerms, SamplesContext
from cfl.models import MODELS, ModelShape
from cfl.ops.aggregate import AGGREGATORS
from cfl.ops.fisher import diagonal_fisher, output_norm_importance
from cfl.ops.layer_inputs import layer_grams
from cfl.ops.losses import LOSSES
from cfl.streams import StreamRequest
from cfl.streams import register as register_stream
from cfl.tensors import Params, State, nbytes

__all__ = [
    # the method interface (cfl/methods/base.py) and its hooks' values (cfl/methods/hook_types.py)
    "Method", "NoHyperparams", "Quadratic", "Linear", "Samples", "ClientData", "RunInfo", "StateSizing", "Step",
    "LocalTraining", "Event", "EVENTS", "BackboneUpdate",
    # its declarations (cfl/methods/declarations.py) and their kinds
    "Requires", "Sends", "Computes", "BroadcastEvent", "Scenario", "ModelTrain", "ServerTaskEnd",
    # the server hooks' values (cfl/methods/server_hooks.py)
    "ServerEvent", "ServerChange", "ServerMoment", "SERVER_EVENTS", "ServerUpdate", "TransformUpdate",
    # the contexts of the traffic and parameter-role hooks (cfl/methods/traffic_hooks.py)
    "ParamNames", "ParamRoles", "TrainedClient", "StackedUploads", "Payload", "PayloadKind", "PAYLOAD_KINDS",
    # the contexts and results of loss, samples and client_end (cfl/methods/training_hooks.py)
    "LossContext", "LossTerms", "SamplesContext", "Draw", "ClientEndContext",
    # a client's round start and round terms (cfl/methods/client_hooks.py)
    "ClientRoundStart", "ClientStart", "StartPart", "ClientRound", "RoundTerms", "TermPart",
    # a classifier set in closed form from the clients' statistics of cached features (cfl/methods/closed_form.py)
    "ClosedFormHead",
    # types and helpers of hooks
    "Params", "State", "nbytes", "field", "ConfigError",
    "diagonal_fisher", "output_norm_importance", "layer_grams",
    # registration
    "register", "METHODS", "register_stream", "Stream", "StreamRequest", "Task", "split_tasks", "permuted_tasks",
    "MODELS", "ModelShape", "PARTITIONERS", "AGGREGATORS", "LOSSES",
]
