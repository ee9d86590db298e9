"""Kernels dispatched and host synchronisations of a piece of torch code, counted on any device.

On a GPU every dispatched operator launches at least one kernel and costs microseconds whatever its size, and
every host synchronisation stalls the launch queue: a federated round of small products is bound by these two
counts, not by arithmetic. Both are counted here with a ``TorchDispatchMode`` (the operators that reach the
backend, after autograd, so the backward pass is counted too), which runs the same on the CPU: the counts of a
commit can be compared on this machine without a GPU.

- ``kernels``: aten operators dispatched to a backend. Views (``view``, ``expand``, ``t``, ``as_strided``, ...)
  launch nothing and are counted apart as ``views``; an operator that a backend runs as several kernels still
  counts one, so this is a lower bound of a GPU's launches.
- ``host_reads``: operators whose result the host must read before it goes on: ``aten._local_scalar_dense``
  (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``), the operators whose output size depends on values
  (``nonzero``, ``masked_select``, ``unique``...), ``equal``, and copies from a non-CPU device to the CPU; plus
  calls of ``Tensor.tolist`` and ``Tensor.numpy`` (patched while counting: they read memory without an operator).
- ``syncs``: the host reads of a tensor on a non-CPU device, the ones that stall a GPU's queue. On the CPU every
  tensor is a CPU tensor, so there ``syncs`` is 0 and ``host_reads`` is the bound: it also counts the engine's
  host-side bookkeeping (the batch schedule is built in CPU tensors on every device), which ``host_read_ops``
  lets a reader tell apart.
- bf16-mixed's compiled step (:func:`cfl.engine.local.bf16_step.step_cast`, one Inductor kernel): ``torch.compile``
  refuses to run under a non-infra dispatch mode (``fullgraph=True`` raises "found no compiled frames"), so
  while counting, the compiled pass runs outside this mode (its compilation too, uncounted) and counts as one
  kernel, ``compiled_step_cast`` in ``by_op``: what a GPU launches for it.

    with DispatchCounter() as counter:
        train_round()
    counter.kernels, counter.host_reads, counter.syncs, counter.by_op.most_common(5)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from cfl.engine.local import bf16_step

DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
                  "unique_dim", "repeat_interleave", "index_select_backward_dense", "nonzero_static_fallback"}
#: operators that return a host value computed on the device
HOST_VALUE = {"_local_scalar_dense", "equal", "is_nonzero"}
#: operators that return a view of their input and launch no kernel
VIEWS = {"view", "_unsafe_view", "expand", "t", "transpose", "permute", "as_strided", "unsqueeze", "squeeze",
         "select", "slice", "alias", "detach", "unbind", "split", "split_with_sizes", "chunk", "narrow",
         "_reshape_alias", "view_as_real", "view_as_complex", "lift_fresh", "unfold", "diagonal", "movedim",
         "_neg_view", "_conj"}
#: Tensor methods that read memory on the host without dispatching an operator on the CPU
HOST_READS = ("tolist", "numpy")
#: the name under which one call of bf16-mixed's compiled step counts as one kernel
COMPILED_STEP = "compiled_step_cast"


def _name(func: Any) -> str:
    """``aten.add_.Tensor`` -> ``add_`` (the overload packet's name)."""
    return func.overloadpacket.__name__


class DispatchCounter(TorchDispatchMode):
    """Counts the kernels (non-view aten operators) and host synchronisations of the code run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.views = 0
        self.host_reads = 0
        self.syncs = 0
        self.by_op: Counter[str] = Counter()
        self.read_ops: Counter[str] = Counter()
        self._patched: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        name = _name(func)
        if name in VIEWS:
            self.views += 1
        else:
            self.kernels += 1
            self.by_op[name] += 1
        if name in HOST_VALUE or name in DATA_DEPENDENT or self._copies_to_host(name, args, kwargs):
            self._read(name, args)
        return func(*args, **kwargs)

    @staticmethod
    def _copies_to_host(name: str, args: tuple, kwargs: dict) -> bool:
        """A copy whose source is on a device and whose result is on the CPU (``.cpu()``, ``.to('cpu')``)."""
        if name not in ("_to_copy", "copy_") or not args or not isinstance(args[0], torch.Tensor):
            return False
        if name == "copy_":
            dst, src = args[0], args[1]
            return dst.device.type == "cpu" and src.device.type != "cpu"
        target = kwargs.get("device")
        return args[0].device.type != "cpu" and target is not None and torch.device(target).type == "cpu"

    def _read(self, name: str, args: tuple) -> None:
        self.host_reads += 1
        self.read_ops[name] += 1
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            self.syncs += 1

    def __enter__(self) -> DispatchCounter:
        for method in HOST_READS:
            original = getattr(torch.Tensor, method)
            self._patched[method] = original

            def counted(tensor: torch.Tensor, *a: Any, _original: Any = original, _method: str = method,
                        **k: Any) -> Any:
                self._read(_method, (tensor,))
                return _original(tensor, *a, **k)

            setattr(torch.Tensor, method, counted)
        self._patch_compiled_step()
        return super().__enter__()

    def _patch_compiled_step(self) -> None:
        """``bf16_step._kernel`` replaced while counting: the compiled pass is looked up (compiled on first use)
        and run outside this mode, and each call counts one kernel (see the module's docstring)."""
        original = bf16_step._kernel
        self._patched["bf16_step._kernel"] = original

        def outside_the_mode(device: torch.device) -> Any:
            with _disable_current_modes():
                kernel = original(device)
            if kernel is None:
                return None

            def counted(*args: Any) -> Any:
                self.kernels += 1
                self.by_op[COMPILED_STEP] += 1
                with _disable_current_modes():
                    return kernel(*args)

            return counted

        bf16_step._kernel = outside_the_mode

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for method, original in self._patched.items():
                if method == "bf16_step._kernel":
                    bf16_step._kernel = original
                else:
                    setattr(torch.Tensor, method, original)
            self._patched.clear()

    def summary(self, steps: int) -> dict[str, Any]:
        """The counts as ``perf_engine.py`` prints them: per round, per local step, the busiest operators."""
        return {"kernels_per_round": self.kernels, "kernels_per_step": round(self.kernels / max(steps, 1), 1),
                "views_per_round": self.views, "host_reads_per_round": self.host_reads,
                "device_syncs_per_round": self.syncs, "host_read_ops": dict(self.read_ops),
                "top_kernels": dict(self.by_op.most_common(8))}
