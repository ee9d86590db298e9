"""Engine speed against the naive per-client loop and the machine's matrix-product peak (docs/performance.md).

Permuted-MNIST reference setup by default: MLP 784-400-400-400-10 (dropout 0.2/0.5/0.5), 125 clients of
480 samples, 64 sampled per round, batch 64, one local epoch, plain SGD lr 0.01 (synthetic data;
``--optimizer adam``: the engine trains with local Adam instead, the path it takes in the JSON's ``path``).
``--setup cifar``: the AlexNet-like Split CIFAR-100 setup (25 of 50 clients, batch 16, 32x32x3).
``--setup resnet``: the reduced ResNet-18 on 32x32x3 images (10 of 20 clients, 200 samples each, batch 32).
Prints a JSON object as its last line. ``peak_gflops`` is the machine's best rate in the engine's
precision: a 2048x2048 by 2048x2048 product (float32, or bfloat16 with ``--precision bf16-mixed``), the best
of several timings in the same process; ``peak_fraction`` counts 6 x parameters x samples per round against
it; the ``*_counted`` fields use the FLOPs torch's ``FlopCounterMode`` counts for a training step, the real
work of a conv net (for the MLP the two agree up to the first layer's unneeded input gradient).
``engine_shape_gflops`` is the rate of the engine's own batched product shape in that precision (for the
MLP 64 x (64x784 @ 784x400)), for comparison with the peak.
For the MLP, ``products_floor_sec_per_round`` is the time of the round's batched products alone in the
engine's precision (:func:`linear_products_floor`) and ``speedup_bound_vs_naive`` the speedup an engine
would reach if everything else (activations, dropout, loss, data gathering) cost nothing.

``--precision bf16-mixed``: the engine trains in bf16-mixed (``cfl/engine/local/precision.py``), and the float32
engine is timed in the same run, its rounds interleaved with the bf16 ones so that both see the same load:
``engine_sec_per_round`` is then bf16-mixed's, ``fp32_engine_sec_per_round`` float32's,
``speedup_vs_fp32`` their ratio, and ``fp32_peak_gflops`` / ``bf16_peak_gflops`` the 2048x2048 rates.

    python benchmarks/perf_engine.py [--rounds 3] [--setup pmnist|cifar|resnet] [--threads N] [--ragged BETA]
                                     [--device cpu|cuda] [--method fedavg|fedprox|ewc|rgo] [--vmap]
                                     [--precision 32|bf16-mixed] [--optimizer sgd|adam|adamw]

``--device cuda``: model, data and both loops on the GPU (the naive loop's DataLoader indexes GPU tensors),
the peak a float32 batched product there (TF32 off, torch's default), every timing synchronised.

Every run also counts one engine round's dispatched operators and host synchronisations
(``benchmarks/dispatch_count.py``): ``kernels_per_round``, ``kernels_per_step`` (per batched local step, the
longest client's step count), ``host_reads_per_round`` (values the host waits for, with the operators behind
them), ``device_syncs_per_round`` (those of device tensors: 0 on the CPU). On a GPU each operator is at
least one kernel launch, so these bound a round there whatever the arithmetic costs.

``--ragged BETA``: client sizes ~ Dirichlet(BETA) x total (as the ``quantity`` partitioner), same total and
mean as the equal split; the JSON then also gives ``padded_step_fraction`` (share of the batched steps
that are padding) so the cost of padding can be read against an equal-split run.
"""

from __future__ import annotations

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as cfl/__init__.py does; must precede torch's first tensor

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402

import torch  # noqa: E402
from dispatch_count import DispatchCounter  # noqa: E402  (a sibling: this script runs as benchmarks/perf_engine.py)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cfl.config.precision import is_mixed, parse_precision  # noqa: E402
from cfl.engine.local.batched import BatchedTrainer  # noqa: E402
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods, derive_seed  # noqa: E402
from cfl.engine.local.path import choose_path  # noqa: E402
from cfl.engine.local.precision import LOW, has_bf16_units  # noqa: E402
from cfl.methods.base import RunInfo  # noqa: E402
from cfl.methods.ewc import EWC, EWCHyperparams  # noqa: E402
from cfl.methods.fedavg import FedAvg  # noqa: E402
from cfl.methods.fedprox import FedProx, FedProxHyperparams  # noqa: E402
from cfl.methods.rgo import RGO, RGOHyperparams  # noqa: E402
from cfl.models import ModelShape, build_model  # noqa: E402
from cfl.models.layers import protected_layers  # noqa: E402
from cfl.records.client_states import MethodState  # noqa: E402

SETUPS = {
    "pmnist": {"model": "mlp", "shape": (784,), "classes": 10, "tasks": 1, "multi": False, "clients": 125,
               "sampled": 64, "per_client": 480, "batch": 64},
    "cifar": {"model": "alexnet", "shape": (3, 32, 32), "classes": 10, "tasks": 10, "multi": True, "clients": 50,
              "sampled": 25, "per_client": 500, "batch": 16},
    # the reduced ResNet-18 (GPM/FOT's Mini-ImageNet net) on 32x32 images: a BatchNorm net, the vmap path
    "resnet": {"model": "resnet18-reduced", "shape": (3, 32, 32), "classes": 10, "tasks": 10, "multi": True,
               "clients": 20, "sampled": 10, "per_client": 200, "batch": 32},
}


def naive_round(model: nn.Module, x: torch.Tensor, y: torch.Tensor, parts: list[torch.Tensor], hp: Hyper,
                task: int) -> dict[str, torch.Tensor]:
    """What research code usually does: deepcopy, DataLoader, fresh SGD, one epoch per client, then average."""
    results, sizes = [], []
    for idx in parts:
        local = copy.deepcopy(model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        loader = DataLoader(TensorDataset(x[idx], y[idx]), batch_size=hp.batch_size, shuffle=True)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(local(xb, torch.full_like(yb, task)), yb)
            loss.backward()
            opt.step()
        results.append({k: v.detach() for k, v in local.state_dict().items()})
        sizes.append(len(idx))
    total = sum(sizes)
    return {k: sum(r[k] * (s / total) for r, s in zip(results, sizes, strict=True)) for k in results[0]}


def timed(fn, repeats: int) -> tuple[float, float]:
    """Mean (wall, process CPU) seconds of ``fn``. On a shared machine the CPU time with one thread is
    the figure that other processes disturb least (it still counts memory-bandwidth contention)."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(repeats):
        fn(i)
    sync()
    return (time.perf_counter() - wall) / repeats, (time.process_time() - cpu) / repeats


def peak_gflops(batch: int, m: int, k: int, n: int, device: str, repeats: int = 20,
                trials: int = 5, dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    """Batched matrix-product rate in ``dtype`` (GFLOP/s; by wall and by CPU time) measured in this process:
    the best of ``trials`` timings of ``repeats`` products (a peak, so noise only lowers the others)."""
    a = torch.randn(batch, m, k, device=device).to(dtype)
    b = torch.randn(batch, k, n, device=device).to(dtype)
    torch.bmm(a, b)
    wall, cpu = float("inf"), float("inf")
    for _ in range(trials):
        trial_wall, trial_cpu = timed(lambda _: torch.bmm(a, b), repeats)
        wall, cpu = min(wall, trial_wall), min(cpu, trial_cpu)
    flops = 2 * batch * m * k * n
    return flops / wall / 1e9, flops / cpu / 1e9


def counted_flops_per_sample(model: nn.Module, shape: tuple[int, ...]) -> float:
    """Forward+backward FLOPs of one training sample as torch's ``FlopCounterMode`` counts them (matrix
    products and convolutions; a convolution reuses each weight at every position, so this exceeds the
    ``6 x parameters`` rule of ``peak_fraction`` for conv nets)."""
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    x, task = torch.randn(8, *shape, device=device), torch.zeros(8, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        copy.deepcopy(model).train()(x, task).sum().backward()
    return counter.get_total_flops() / 8


def square_peak_gflops(device: str, dtype: torch.dtype, size: int = 2048, repeats: int = 5,
                       trials: int = 5) -> tuple[float, float]:
    """The machine's best matrix-product rate in ``dtype`` (GFLOP/s; by wall and by CPU time): a ``size`` x
    ``size`` by ``size`` x ``size`` product, the best of ``trials`` timings of ``repeats`` (a shape BLAS runs
    near its peak, unlike the engine's small batched ones)."""
    return peak_gflops(1, size, size, size, device, repeats, trials, dtype)


def linear_products_floor(model: nn.Module, clients: int, batch: int, device: str, trials: int = 5,
                          dtype: torch.dtype = torch.float32) -> float:
    """Seconds per batch-step of the batched products alone that SGD on the model's linear layers needs at
    this size: per layer the forward, the input gradient (not for the first layer) and the weight gradient
    (float32: with the step, as one ``baddbmm_``; bfloat16: into a preallocated bfloat16 output, the step
    being float32 elementwise work), each the best of ``trials``, in preallocated outputs and in whichever
    weight layout ((C, out, in) or (C, in, out)) makes the three fastest together. A bound for any engine
    built on torch's batched products in ``dtype``: no elementwise work, no data movement."""
    total = 0.0
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        o, n = layer.weight.shape
        x = torch.randn(clients, batch, n, device=device).to(dtype)
        g = torch.randn(clients, batch, o, device=device).to(dtype)
        h = torch.empty(clients, batch, o, device=device, dtype=dtype)
        gx = torch.empty(clients, batch, n, device=device, dtype=dtype)
        best = float("inf")
        for w in ((torch.randn(clients, o, n, device=device) * 0.01).to(dtype),
                  (torch.randn(clients, n, o, device=device) * 0.01).to(dtype).mT):
            if dtype == torch.float32:
                step = (w.baddbmm_, (g.mT, x), {"beta": 1.0, "alpha": -1e-6})
            else:
                grad = torch.empty(w.shape, dtype=dtype, device=device)  # contiguous: a strided bf16 out: ~500x slower
                step = (torch.baddbmm, (grad, g.mT, x), {"beta": 0.0, "out": grad})
            products = [(torch.bmm, (x, w.mT), {"out": h}), step]
            if i > 0:
                products.append((torch.bmm, (g, w), {"out": gx}))
            best = min(best, sum(min(timed(lambda _, f=f, a=a, k=k: f(*a, **k), 5)[0] for _ in range(trials))
                                 for f, a, k in products))
        total += best
    return total


def method_round(name: str, params: dict[str, torch.Tensor], clients: int, model: nn.Module) -> RoundMethods:
    """The engine's method; EWC's clients get a random diagonal Fisher and anchor, RGO's a d x d deflation per
    protected layer (one random symmetric matrix shared by all: the values do not change the cost), as after
    a task end."""
    if name == "fedavg":
        return RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    if name == "fedprox":
        return RoundMethods([FedProx(FedProxHyperparams(mu=0.01), None)], [MethodState()], [{}])
    state = MethodState()
    if name == "rgo":
        protected = protected_layers(model)
        info = RunInfo(num_tasks=2, scenario="domain", num_clients=clients, clients_per_round=clients, seed=0,
                       model=model, protected=protected)
        deflation = {}
        for k in protected:
            a = torch.randn(params[k][0].numel(), 32, device=params[k].device)
            deflation[k] = a @ a.T / (a.norm() ** 2)  # symmetric, eigenvalues in [0, 1)
        for c in range(clients):
            state.clients.put(c, {"deflation": deflation})
        return RoundMethods([RGO(RGOHyperparams(), info)], [state], [{}])
    for c in range(clients):
        state.clients.put(c, {"fisher": {k: torch.rand_like(v) for k, v in params.items()},
                              "anchor": {k: v + 0.01 * torch.randn_like(v) for k, v in params.items()}})
    return RoundMethods([EWC(EWCHyperparams(lam=10.0), None)], [state], [{}])


def ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    """``a / b`` rounded, None where either is missing (the naive loop skipped, no products floor)."""
    return None if a is None or b is None else round(a / b, digits)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", choices=list(SETUPS), default="pmnist")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--naive-rounds", type=int, default=2, help="0: skip the naive loop (its fields null)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--ragged", type=float, default=0.0, help="Dirichlet concentration of client sizes")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--method", choices=["fedavg", "fedprox", "ewc", "rgo"], default="fedavg",
                        help="the engine's method (the naive loop stays plain SGD): fedprox mu 0.01, ewc with "
                             "a synthetic per-client Fisher and anchor, rgo with a synthetic d x d per layer, as "
                             "after a finished task")
    parser.add_argument("--vmap", action="store_true", help="force the vmap path (time penalties on both paths)")
    parser.add_argument("--precision", default="32", help="32 or bf16-mixed (then float32 is timed too)")
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd",
                        help="the engine's local optimiser (betas 0.9/0.999, eps 1e-8; the naive loop stays SGD)")
    args = parser.parse_args()
    precision = parse_precision(args.precision, "--precision")
    dev = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = SETUPS[args.setup]
    torch.manual_seed(0)
    model = build_model(s["model"], ModelShape(s["shape"], s["classes"], s["tasks"], s["multi"])).to(dev)
    n = s["clients"] * s["per_client"]
    x, y = torch.randn(n, *s["shape"], device=dev), torch.randint(0, s["classes"], (n,), device=dev)
    parts = list(torch.arange(n).split(s["per_client"]))
    if args.ragged:
        shares = torch.distributions.Dirichlet(torch.full((s["clients"],), args.ragged)).sample()
        sizes = (shares * n).long().clamp(min=1)
        parts = list(torch.randperm(n)[: int(sizes.sum())].split(sizes.tolist()))
    parts = [p.to(dev) for p in parts]
    hp = Hyper(lr=0.01, momentum=0.0, weight_decay=1e-5, local_epochs=1, batch_size=s["batch"], precision=precision,
               optimizer=args.optimizer)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    num_params = sum(v.numel() for v in params.values())
    round_methods = method_round(args.method, params, s["clients"], model)
    path = "vmap" if args.vmap else choose_path(model, hp, round_methods.methods).path
    hp = replace(hp, path=path)
    hp32 = replace(hp, precision=32)  # the float32 engine
    naive_hp = replace(hp32, optimizer="sgd")  # the naive loop is plain SGD
    sampled = list(range(s["sampled"]))

    mixed = is_mixed(precision)
    engines = {"engine": (BatchedTrainer(), hp)}  # as the round engine runs it: one workspace kept across rounds
    if mixed:
        engines["fp32"] = (BatchedTrainer(), hp32)

    def engine_round(name: str, r: int) -> None:
        jobs = [ClientJob(c, parts[c], None, derive_seed(0, 0, r, c)) for c in sampled]
        trainer, hyper = engines[name]
        trainer(model, params, jobs, x, y, 0, hyper, round_methods)

    times = {name: [0.0, 0.0] for name in engines}
    for name in engines:
        engine_round(name, 10_000)  # warm-up
    for r in range(args.rounds):  # interleaved: both engines see the same spells of load
        for name in engines:
            wall, cpu = timed(lambda _, name=name, r=r: engine_round(name, r), 1)
            times[name][0] += wall / args.rounds
            times[name][1] += cpu / args.rounds
    engine, engine_cpu = times["engine"]
    with DispatchCounter() as counter:  # one more round, its operators and host synchronisations counted
        engine_round("engine", args.rounds)
    naive, naive_cpu = None, None
    if args.naive_rounds:
        naive, naive_cpu = timed(lambda _: naive_round(model, x, y, [parts[c] for c in sampled], naive_hp, 0),
                                 args.naive_rounds)
    samples = sum(len(parts[c]) for c in sampled)
    steps = [-(-len(parts[c]) // s["batch"]) for c in sampled]
    flops = 6 * num_params * samples
    counted = counted_flops_per_sample(model, s["shape"]) * samples
    engine_gflops = flops / engine / 1e9
    dtype = LOW if mixed else torch.float32
    fp32_peak, fp32_peak_cpu = square_peak_gflops(args.device, torch.float32)
    bf16_peak, bf16_peak_cpu = square_peak_gflops(args.device, LOW) if mixed else (None, None)
    peak, peak_cpu = (bf16_peak, bf16_peak_cpu) if mixed else (fp32_peak, fp32_peak_cpu)
    pmnist = args.setup == "pmnist"
    shape = (s["sampled"], s["batch"], 784, 400) if pmnist else (s["sampled"], s["batch"] * 64, 576, 128)  # a conv's
    shape_rate = peak_gflops(*shape, args.device, dtype=dtype)[0]
    floor = None
    if pmnist:
        steps_per_client = samples / s["batch"] / len(sampled)
        floor = linear_products_floor(model, s["sampled"], s["batch"], args.device, dtype=dtype) * steps_per_client
    extra = {}
    if mixed:
        fp32, fp32_cpu = times["fp32"]
        extra = {"fp32_engine_sec_per_round": round(fp32, 4), "fp32_engine_cpu_sec_per_round": round(fp32_cpu, 4),
                 "speedup_vs_fp32": round(fp32 / engine, 2), "speedup_vs_fp32_cpu": round(fp32_cpu / engine_cpu, 2),
                 "fp32_peak_gflops": round(fp32_peak, 2), "bf16_peak_gflops": round(bf16_peak, 2),
                 "fp32_engine_peak_fraction": round(flops / fp32 / 1e9 / fp32_peak, 3),
                 "bf16_units": has_bf16_units(dev)}
    print(json.dumps({
        "setup": args.setup, "method": args.method, "optimizer": args.optimizer, "path": path, "device": args.device,
        "precision": precision, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "params": num_params,
        "clients_per_round": s["sampled"], "samples_per_client": s["per_client"], "batch_size": s["batch"],
        "engine_sec_per_round": round(engine, 4), "naive_sec_per_round": ratio(naive, 1, 4),
        "speedup_vs_naive": ratio(naive, engine), "engine_gflops": round(engine_gflops, 2),
        "peak_gflops": round(peak, 2), "peak_fraction": round(engine_gflops / peak, 3),
        "engine_shape_gflops": round(shape_rate, 2),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 3),
        "engine_cpu_sec_per_round": round(engine_cpu, 4), "naive_cpu_sec_per_round": ratio(naive_cpu, 1, 4),
        "speedup_vs_naive_cpu": ratio(naive_cpu, engine_cpu), "peak_gflops_cpu": round(peak_cpu, 2),
        "peak_fraction_cpu": round(flops / engine_cpu / 1e9 / peak_cpu, 3), "samples_per_round": samples,
        "padded_step_fraction": round(1 - sum(steps) / (len(steps) * max(steps)), 3),
        "counted_gflop_per_round": round(counted / 1e9, 1),
        "engine_gflops_counted": round(counted / engine / 1e9, 2),
        "naive_gflops_counted": ratio(counted / 1e9, naive),
        "peak_fraction_counted": round(counted / engine / 1e9 / peak, 3),
        "naive_peak_fraction_counted": ratio(counted / 1e9 / peak, naive, 3),
        "products_floor_sec_per_round": None if floor is None else round(floor, 4),
        "speedup_bound_vs_naive": ratio(naive, floor),
        "load_average_1min": round(os.getloadavg()[0], 2), **counter.summary(max(steps)), **extra,
    }))


if __name__ == "__main__":
    main()
