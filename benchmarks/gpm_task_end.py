"""GPM+FL's task end per client: milliseconds of ``GPM.client_end`` against the client's sample count.

The Permuted-MNIST reference MLP (784-400-400-400-10, protected layers d = 784, 400, 400 and the shared
head's 400), Gaussian inputs (the cost depends on the shapes, not the values). Per sample count: a
client's first task end (no basis) and its second (on new samples, with the basis of the first), each
timed ``--repeats`` times on fresh states after one untimed pass (the first calls of a process warm up the
BLAS threads), for ``GPM.client_end`` (path ``auto``: thin below d, Gram from d on) and for the same step
with every layer on the d x d Gram path (``gram``: ``layer_grams`` + ``extend_from_gram``). Prints one
JSON line per path and sample count: the medians in ms and the basis widths after each task end.
``--threads 1`` gives steadier figures on a machine shared with other jobs.

    python benchmarks/gpm_task_end.py [--samples 6 60 480] [--repeats 5] [--eps 0.96] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from cfl.methods.base import ClientData, RunInfo
from cfl.methods.gpm import GPM, GPMHyperparams, extend_from_gram
from cfl.models import ModelShape, build_model
from cfl.models.layers import protected_layers
from cfl.ops.layer_inputs import layer_grams
from cfl.tensors import Params


def gram_task_end(gpm: GPM, eps: float) -> Callable[[torch.nn.Module, Params, ClientData, dict], None]:
    """GPM's task end with every layer on the d x d Gram path."""
    def run(model: torch.nn.Module, params: Params, data: ClientData, state: dict) -> None:
        bases = state.setdefault("bases", {})
        grams = layer_grams(model, params, data.x, data.task, gpm.run_info.protected, gpm.hparams.chunk)
        for name, gram in grams.items():
            bases[name] = extend_from_gram(gram, bases.get(name), eps)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[6, 60, 480])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--eps", type=float, default=0.96)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model("mlp", ModelShape((1, 28, 28), 10, 2, False))
    params = {k: v.detach() for k, v in model.named_parameters()}
    info = RunInfo(num_tasks=2, scenario="domain", num_clients=1, clients_per_round=1, seed=0, model=model,
                   protected=protected_layers(model))
    gpm = GPM(GPMHyperparams(eps=args.eps), info)
    gen = torch.Generator()
    paths = {"auto": lambda m, p, d, s: gpm.client_end("task_end", m, p, d, s, {}, gen),
             "gram": gram_task_end(gpm, args.eps)}
    for n in args.samples:
        data = [ClientData(torch.randn(n, 1, 28, 28), torch.zeros(n, dtype=torch.long), t) for t in range(2)]
        for path, task_end in paths.items():
            times: list[list[float]] = [[], []]
            widths: list[dict[str, int]] = [{}, {}]
            for _ in range(args.repeats + 1):
                state: dict = {}
                for t in range(2):
                    start = time.perf_counter()
                    task_end(model, params, data[t], state)
                    times[t].append(time.perf_counter() - start)
                    widths[t] = {k: b.shape[1] for k, b in state["bases"].items()}
            ms = [round(1000 * statistics.median(t[1:]), 1) for t in times]
            print(json.dumps({"samples": n, "path": path, "first_task_end_ms": ms[0], "second_task_end_ms": ms[1],
                              "k_first": widths[0], "k_second": widths[1], "threads": torch.get_num_threads(),
                              "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
