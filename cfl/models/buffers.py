"""The buffers a model carries through federated training: BatchNorm's running statistics.

A BatchNorm layer with ``track_running_stats=True`` keeps ``running_mean``, ``running_var`` and
``num_batches_tracked``; its training forwards update them in place and its evaluation forwards read them. The
engine keeps these buffers with the global parameters (``model.buffers`` in the config, docs/concepts.md).
other buffers (none of the registered models has any) are left to the module. A model without running
statistics carries an empty dict, and everything the engine does with buffers is then a no-op.
"""

from __future__ import annotations

from torch import nn

from cfl.tensors import Params

#: the registered model with BatchNorm running statistics (what TARGET and MFCL need; ``model: auto`` for them)
RUNNING_BN_MODEL = "resnet18-reduced-running-bn"


def running_stats(model: nn.Module) -> Params:
    """``{name: copy}`` of every running-statistics buffer of ``model`` (its BatchNorm layers that track them),
    in ``named_buffers`` order; ``{}`` for a model without any."""
    out: Params = {}
    for prefix, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats:
            for name, buffer in module.named_buffers(recurse=False):
                if buffer is not None:
                    out[f"{prefix}.{name}" if prefix else name] = buffer.detach().clone()
    return out


def keeps_running_stats(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer with running statistics."""
    return any(isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats for m in model.modules())


def load_global_model(model: nn.Module, params: Params, buffers: Params) -> nn.Module:
    """``model`` (the run's template module) with ``params`` and ``buffers`` copied into its own parameters and
    buffers, returned: the global model as an ordinary ``nn.Module``, for code that calls it directly rather
    than through ``functional_call`` (e.g. a hook that receives the task's final model)."""
    own = dict(model.named_parameters())
    own.update(model.named_buffers())
    missing = [k for k in [*params, *buffers] if k not in own]
    if missing:
        raise KeyError(f"the model has no parameter or buffer named {', '.join(missing[:3])}")
    for k, v in [*params.items(), *buffers.items()]:
        own[k].data.copy_(v.detach())
    return model
