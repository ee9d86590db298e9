"""Checks between config keys that need the registries but no data: the model against the stream, the
methods against the rest of the config, the thread count against this machine.

Called by :func:`cfl.validation.validate_names`, so every run and every sweep combination is checked before
any file is written or any data is loaded.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from cfl.config.schema import ConfigError
from cfl.failures import USER_FAILURES
from cfl.methods.base import Method
from cfl.methods.hook_guard import hook_error
from cfl.pretrained.backbones import BACKBONES, is_backbone

#: the shape a model is built for to see whether it keeps BatchNorm running statistics (any square image it takes)
RUNNING_STATS_PROBE_INPUT = (3, 32, 32)

#: most torch CPU threads per CPU core a run may ask for (each is an OS thread)
THREADS_PER_CPU = 4


def stream_entry(name: str) -> Any:
    from cfl.data.stream_registry import STREAMS

    return STREAMS[name]


def resolve_model(stream_name: str, model_name: str, method_name: str = "") -> str:
    """``auto`` -> the first of the method's own models (``Method.requires.models``) where it has some, else the
    stream's reference model; any other name is returned unchanged."""
    if model_name != "auto":
        return model_name
    from cfl.methods import METHODS

    cls = METHODS[method_name] if method_name in METHODS else None
    own = cls.requires.models if cls is not None else ()
    if own:
        return own[0]
    return (cls.requires.running_stats_model if cls is not None else "") or stream_entry(stream_name).default_model


def model_family_error(model_name: str, method_names: list[str]) -> str | None:
    """Why ``model_name`` cannot be trained by the run's methods (None if it can): a method with models of its own
    (``Method.requires.models``) trains only those, and those are trained by it alone; a method that reads BatchNorm
    running statistics (``Method.requires.running_stats_model``) needs a model that keeps them."""
    from cfl.methods import METHODS
    from cfl.models import ModelShape
    from cfl.pretrained.backbones import BACKBONES, is_backbone

    for name in method_names:
        needed = METHODS[name].requires.running_stats_model
        if needed and not _keeps_running_stats(model_name, ModelShape(RUNNING_STATS_PROBE_INPUT, 2, 1, False)):
            return (f"method {name} matches its synthetic images to the model's BatchNorm running statistics; model "
                    f"{model_name} keeps none: set model.name: {needed} (or auto)")
        if METHODS[name].requires.backbone_only and not is_backbone(model_name):
            return (f"method {name} runs on a frozen pretrained backbone; the run's model is "
                    f"{model_name}: set model.name to a pretrained backbone ({', '.join(BACKBONES)}) and "
                    f"model.weights (docs/pretrained.md)")
        own = METHODS[name].requires.models
        if own and model_name not in own:
            return (f"method {name} trains its own networks only ({', '.join(own)}); the run's model is {model_name}: "
                    f"set model.name: {own[0]} (or auto)")
    owners = [name for name, cls in METHODS.items() if model_name in cls.requires.models]
    if owners and owners[0] not in method_names:
        return (f"model {model_name} is method {owners[0]}'s own network: another method would average all of its "
                f"per-client parts; set method.name: {owners[0]}, or another model")
    return None


def check_model_family(cfg: Any) -> None:
    """Refuse a model of a method's own family with another method, or such a method with another model."""
    error = model_family_error(cfg.model.name, [cfg.method["name"], *[p["name"] for p in cfg.plugins]])
    if error is not None:
        raise ConfigError(error)


def model_fit_error(model_name: str, stream_name: str, scenario: str, num_tasks: int | None) -> str | None:
    """Why ``model_name`` cannot take the stream's inputs (None if it can), found by building it with
    uninitialised weights (no init cost) and running a two-sample forward pass of zeros (no data)."""
    from cfl.models import ModelShape, build_model

    entry = stream_entry(stream_name)
    scenario = entry.scenarios[0] if scenario == "auto" else scenario
    shape = ModelShape(entry.input_shape, entry.head_classes(scenario), num_tasks or entry.full_tasks,
                       scenario == "task")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # torch warns of zero-sized layers, which the forward then refuses
            with torch.device("meta"):
                model = build_model(model_name, shape)
            model.to_empty(device="cpu").eval()(torch.zeros(2, *entry.input_shape), torch.zeros(2, dtype=torch.long))
    except (RuntimeError, ValueError) as err:
        return str(err).splitlines()[0]
    return None


def check_model_fits(cfg: Any) -> None:
    """Refuse a model whose layers do not fit the stream's input shape (e.g. alexnet on 8x8 digits)."""
    from cfl.models import MODELS
    from cfl.pretrained.backbones import is_backbone

    stream = cfg.stream
    if cfg.model.name == stream_entry(stream.name).default_model:  # the reference model (tests check it fits)
        return
    if is_backbone(cfg.model.name):  # its inputs are resized to the backbone's (cfl/pretrained/features.py)
        return
    reason = model_fit_error(cfg.model.name, stream.name, stream.scenario, stream.num_tasks)
    if reason is None:
        return
    fitting = [m for m in MODELS if model_fit_error(m, stream.name, stream.scenario, stream.num_tasks) is None]
    raise ConfigError(f"'model.name: {cfg.model.name}' does not fit stream '{stream.name}' (inputs "
                      f"{stream_entry(stream.name).input_shape}): {reason}; use model.name: auto or one of: "
                      f"{', '.join(fitting)}")


def check_model_buffers(cfg: Any) -> None:
    """Refuse ``model.buffers: local`` on a model without BatchNorm running statistics (nothing to keep local)."""
    if cfg.model.buffers == "averaged":
        return
    from cfl.ignored_keys import IgnoredKey
    from cfl.models import MODELS, ModelShape

    entry = stream_entry(cfg.stream.name)
    scenario = entry.scenarios[0] if cfg.stream.scenario == "auto" else cfg.stream.scenario
    shape = ModelShape(entry.input_shape, entry.head_classes(scenario), cfg.stream.num_tasks or entry.full_tasks,
                       scenario == "task")
    if _keeps_running_stats(cfg.model.name, shape):
        return
    keeping = [n for n in MODELS if _keeps_running_stats(n, shape)]
    raise IgnoredKey("model.buffers", cfg.model.buffers, "model.name", cfg.model.name,
                     "the model keeps no BatchNorm running statistics", "remove model.buffers, or use a model that "
                     f"keeps them: {', '.join(keeping) or 'none registered fits this stream'}",
                     keeping[0] if keeping else None)


def _keeps_running_stats(model_name: str, shape: Any) -> bool:
    """Whether model ``model_name``, built for ``shape`` (without weights), has BatchNorm running statistics."""
    from cfl.models import build_model
    from cfl.models.buffers import keeps_running_stats

    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")  # torch warns of zero-sized layers of models that do not fit the stream
            return keeps_running_stats(build_model(model_name, shape))
    except (RuntimeError, ValueError):  # a model that cannot take the stream's inputs
        return False


def check_methods(cfg: Any, specs: list[dict[str, Any]]) -> None:
    """Each method's scenarios (``Method.requires.scenarios``; ``auto``: the stream's default) and own constraints
    against the rest of the config (``Method.check``)."""
    from cfl.data.stream_registry import STREAMS
    from cfl.methods import METHODS
    from cfl.methods.declarations import refuse_scenario

    scenario = cfg.stream.scenario
    if scenario == "auto" and cfg.stream.name in STREAMS:
        scenario = STREAMS[cfg.stream.name].scenarios[0]
    for spec in specs:
        cls = METHODS[spec["name"]]
        refuse_scenario(cls, scenario)
        try:
            cls.check(cls.Hyperparams(**{k: v for k, v in spec.items() if k != "name"}), cfg)
        except ConfigError:  # the way a method refuses a config
            raise
        except USER_FAILURES as err:  # anything else is a fault of the method's own code
            raise hook_error(cls, "check", err) from err


def check_client_params(cfg: Any, specs: list[dict[str, Any]]) -> None:
    """Parameters kept per client (``Method.param_roles`` and its kin) run on the sequential trainer of the local
    backend; one method at most aggregates with its own ``server_aggregate``, beside the plain mean only."""
    from cfl.methods import METHODS
    from cfl.methods.base import per_client_hooks

    keeping = [s["name"] for s in specs if per_client_hooks(METHODS[s["name"]])]
    if keeping and cfg.backend == "ray":
        raise ConfigError(f"method {keeping[0]} keeps parameters per client, which only the local backend's "
                          "sequential trainer loads: set backend: local")
    if keeping and cfg.client_forgetting_clients:
        raise ConfigError(f"method {keeping[0]} keeps parameters per client: client forgetting compares each client's "
                          "model with the global one, which lacks them; set client_forgetting_clients: 0")
    def own(hook: str) -> list[str]:
        return [s["name"] for s in specs if getattr(METHODS[s["name"]], hook) is not getattr(Method, hook)]

    never = sorted(set(own("server_aggregate")) - set(own("client_upload")))
    if never:
        raise ConfigError(f"method {never[0]} overrides server_aggregate but not client_upload, which gives it what "
                          "to combine: it would never be called; override client_upload too")
    if len(own("client_upload")) > 1:
        first, second = own("client_upload")[:2]
        raise ConfigError(f"methods {first} and {second} both upload with their own client_upload; a run takes one "
                          "of them: drop one from method/plugins")
    uploading = own("client_upload")
    if uploading and cfg.aggregator.name != "mean":
        raise ConfigError(f"method {uploading[0]} aggregates with its own client_upload/server_aggregate; 'aggregator: "
                          f"{cfg.aggregator.name}' would mask its step: set aggregator.name: mean")


def check_task_losses(cfg: Any, specs: list[dict[str, Any]]) -> None:
    """At most one method replaces the cross-entropy (``Method.loss``'s task part: ``computes.losses`` lists
    "task"), and none beside ``loss: tce`` (which changes the cross-entropy such a method replaces)."""
    from cfl.methods import METHODS

    own = [s["name"] for s in specs if "task" in METHODS[s["name"]].computes.losses]
    if len(own) > 1:
        raise ConfigError(f"methods {own[0]} and {own[1]} both replace the task loss (losses 'task'); a run takes one "
                          "of them: drop one from method/plugins")
    if own and cfg.loss != "ce":
        raise ConfigError(f"'loss: {cfg.loss}' with method {own[0]}, whose own task loss replaces the cross-entropy "
                          "that loss would change: remove 'loss' (or use another method)")


def check_optimizer(cfg: Any, specs: list[dict[str, Any]]) -> None:
    """The local optimiser's own keys: two betas in [0, 1); ``optimizer.state: kept`` only where there is a state
    (not plain SGD) and off Ray; AdamW's decoupled weight decay with a gradient projection, which would shrink the
    protected directions; no empty ``lr_groups`` prefix (the model's names are checked by the run)."""
    from cfl.config.lr_groups import check_empty_prefix
    from cfl.methods import METHODS
    from cfl.methods.declarations import gives

    check_empty_prefix(cfg.lr_groups)
    optimizer = cfg.optimizer
    projecting = [s["name"] for s in specs if gives(METHODS[s["name"]], "projection")]
    if optimizer.name == "adamw" and cfg.weight_decay and projecting:
        raise ConfigError(f"'optimizer.name: adamw' with 'weight_decay: {cfg.weight_decay}': method "
                          f"{projecting[0]} projects the gradient off its protected subspace, but AdamW's decoupled "
                          "decay would shrink the weights along it; use optimizer.name: adam (its L2 term is "
                          "projected) or weight_decay: 0")
    betas = optimizer.betas
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"'optimizer.betas' must be two numbers in [0, 1) (first and second moment), got {betas}")
    if optimizer.state == "kept" and optimizer.name == "sgd" and cfg.momentum == 0:
        raise ConfigError("'optimizer.state: kept' with plain SGD (momentum 0): it has no state to keep; set "
                          "'momentum' > 0 or optimizer.name: adam/adamw, or use optimizer.state: fresh")
    if optimizer.state == "kept" and cfg.backend == "ray":
        raise ConfigError("'optimizer.state: kept' with 'backend: ray': the Ray workers do not carry the clients' "
                          "optimiser states; use backend: local, or optimizer.state: fresh")


def check_threads(threads: int) -> None:
    """Refuse more torch threads than ``THREADS_PER_CPU`` per CPU of this machine."""
    cpus = os.cpu_count() or 1
    if threads > THREADS_PER_CPU * cpus:
        raise ConfigError(f"'threads' is {threads}, but this machine has {cpus} CPUs; use 0 (torch's default) "
                          f"or at most {THREADS_PER_CPU * cpus}")


def check_backbone_changes(cfg: Any, classes: list[Any]) -> None:
    """A method that changes the shared frozen backbone at task ends (``changes_backbone``) needs one: a
    pretrained backbone run at every step through its adapter (``model.train: prompts | components | lora``). The
    feature cache (``head``) holds the unchanged backbone's features, and ``all`` has no shared frozen part."""
    changers = [c.name for c in classes if c.sends.changes_backbone]
    if not changers:
        return
    model, who = cfg.model, f"method {', '.join(changers)} changes the shared frozen backbone at task ends"
    if not is_backbone(model.name):
        raise ConfigError(f"{who}; model {model.name} has none: use a pretrained backbone ({', '.join(BACKBONES)}) "
                          "with model.train: prompts, components or lora")
    if model.train == "head":
        raise ConfigError(f"{who}; model.train: head trains on features cached from the unchanged backbone, which "
                          "would go stale: set model.train: prompts, components or lora")
    if model.train == "all":
        raise ConfigError(f"{who}; model.train: all trains the whole backbone per client, so there is no shared "
                          "frozen part: set model.train: prompts, components or lora")
