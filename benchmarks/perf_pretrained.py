"""cfl's round on a frozen pretrained ViT (all sampled clients through one backbone pass per step) against a
per-client loop that gives each client its own copy of the whole model in turn and trains it with a torch
optimiser (fed-mammoth's way: a client's model moved to the device, trained, moved back), same backbone, batch,
clients and steps, in the same process, the two alternating (docs/pretrained.md).

Setup: a random ViT-Ti/16 (``--model``) at ``--size`` px, ``--train`` prompts (L2P: pool 10, length 5, top 5, the
surrogate key loss), dual-prompts (DualPrompt: G-prompt 5 in blocks 0-1, E-prompts 5 in blocks 2-4, the key pull) or
lora, ``--clients`` clients of ``--samples`` each, all sampled, batch ``--batch``, one local
epoch, SGD. ``cfl`` is a real Runner round (cfl/engine/local/batched.py); ``loop`` copies the template model (backbone
included) per client, loads the global trainable values, trains its batches with the same losses and returns the
trainable values; its prompt methods run the frozen query pass once a step (fed-mammoth's ``original_model``),
cfl's round reads each sample's query computed once when the run starts (that pass's time printed apart,
``query_seconds``: once a run, not a round; ``speedup_one_round`` charges all of it to a single round). Peak
``speedup`` is the ratio of the best rounds; ``speedup_median_pair`` the median of each round's ratio to its neighbour's
(the two run next to each other, so it holds where another job slows the machine for a while). Peak
memory: each kind's round in a fresh child process, the growth of the peak resident set
over the round (Linux's ``VmHWM``, reset before it).

The loop's last block (``--loop-last-block``): ``whole`` (the default) runs every token through the last block and
the final norm and then picks the head's rows, as fed-mammoth's prompt ViTs do (``forward_features``: ``self.blocks``
then ``self.norm`` over all tokens, in ``_networks/vit_prompt_l2p.py`` and ``vit_prompt_dual.py``); ``rows`` gives
the loop cfl's own last block over the head's rows (cfl/pretrained/final_block.py), a loop that already has that
saving. Arithmetic: one more round of each kind under torch's ``FlopCounterMode`` (its count of the products,
forward and backward) gives ``flop_ratio``, the speedup the products alone allow, and ``of_flop_ratio``, the
measured ``speedup`` over it. Prints a JSON line.

    python benchmarks/perf_pretrained.py [--rounds 3] [--clients 8] [--batch 16] [--size 32] [--train prompts]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cfl.data.stream import Stream, Task  # noqa: E402
from cfl.engine.rounds.runner import Runner  # noqa: E402
from cfl.methods.dualprompt import pull  # noqa: E402
from cfl.ops.losses import masked_cross_entropy  # noqa: E402
from cfl.pretrained.features import with_backbone  # noqa: E402
from cfl.pretrained.prompt_pool import key_distance  # noqa: E402
from cfl.pretrained.queries import packed  # noqa: E402
from cfl.validation import from_dict  # noqa: E402

METHOD = {"prompts": "l2p", "lora": "lora", "dual-prompts": "dualprompt"}
#: the adapter keys of each ``--train`` (DualPrompt's official one E-prompt an input, at least one a task)
MODEL_KEYS = {"dual-prompts": {"prompt_top_k": 1}}


def setup(args: argparse.Namespace, execution: str = "batched") -> Runner:
    cfg = from_dict({"stream": {"name": "split-digits", "num_tasks": 1}, "seed": 0,
                     "model": {"name": args.model, "weights": "random", "image_size": args.size, "train": args.train,
                               **MODEL_KEYS.get(args.train, {})},
                     "method": {"name": METHOD[args.train]}, "num_clients": args.clients,
                     "clients_per_round": args.clients, "rounds_per_task": 1000, "batch_size": args.batch,
                     "lr": 0.01, "client_execution": execution, "wandb": {"mode": "disabled"},
                     "precision": args.precision, "client_block": args.client_block,
                     "data_root": tempfile.mkdtemp(prefix="perf-pretrained-")})  # the queries computed, not loaded
    g = torch.Generator().manual_seed(0)
    n = args.clients * args.samples
    x, y = torch.randn(n, 3, 8, 8, generator=g), torch.arange(n) % 10
    stream = Stream("synthetic", "class", [Task("t0", x, y, x[:16], y[:16], list(range(10)))], 10, (3, 8, 8),
                    args.model)
    return Runner(cfg, with_backbone(cfg, stream, torch.device("cpu"), quiet=True))


def cfl_round(runner: Runner, r: int) -> None:
    runner.run_round(0, r)


def loop_round(runner: Runner, args: argparse.Namespace) -> None:
    """Per client: a copy of the whole model (the move), the global trainable values loaded, its batches trained
    with torch.optim.SGD (cross-entropy, plus L2P's key loss or DualPrompt's key pull), the trainable values
    collected; FedAvg. The prompt methods' query is the frozen backbone's pass of each batch, once a step, shared by
    the forward and the key loss (fed-mammoth's and l2p-pytorch's ``original_model`` pass), where cfl's round reads
    the queries computed once per sample (cfl/pretrained/queries.py)."""
    x, y = runner.stream.tasks[0].train_x, runner.stream.tasks[0].train_y
    layout = runner.model.layout
    images = x if layout is None else layout.split(x)[0]
    names = list(runner.params)
    collected = []

    def low() -> torch.autocast:  # bf16-mixed: the loop's products in bfloat16, as cfl's
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")

    for c in range(args.clients):
        model = copy.deepcopy(runner.model)  # the client's model, backbone included, as fed-mammoth moves it
        model.rows_only = args.loop_last_block == "rows"  # whole: every token through the last block, as fed-mammoth
        own = dict(model.named_parameters())
        with torch.no_grad():
            for k in names:
                own[k].copy_(runner.params[k])
        opt = torch.optim.SGD([own[k] for k in names], lr=0.01)
        idx = torch.arange(c * args.samples, (c + 1) * args.samples)
        model.train()
        for s in range(0, args.samples, args.batch):
            xb, yb = images[idx[s:s + args.batch]], y[idx[s:s + args.batch]]
            if layout is not None:  # this step's frozen query pass, then the rows the model reads it from
                with torch.no_grad(), low():
                    xb = packed(xb, model.vit(model.resized(xb)).float())
            with low():
                logits = model(xb, torch.zeros_like(yb)).float()
            loss = masked_cross_entropy(logits, yb, None).mean()
            if args.train == "prompts":
                loss = loss + 0.1 * key_distance(model.query(xb), own["prompt.keys"], model.prompt.top_k).mean()
            if args.train == "dual-prompts":
                loss = loss + pull(model.query(xb), own["prompt.keys"], torch.zeros_like(yb), 1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        collected.append({k: own[k].detach().clone() for k in names})
    runner.params = {k: torch.stack([p[k] for p in collected]).mean(0) for k in names}


def round_flops(run: Callable[[], None]) -> int:
    """The floating-point operations of the products (matrix products, convolutions, attention kernels) in one call
    of ``run``, forward and backward, counted by torch's ``FlopCounterMode``."""
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def _status_kib(key: str) -> int:
    line = next(v for v in Path("/proc/self/status").read_text().splitlines() if v.startswith(key + ":"))
    return int(line.split()[1])


def peak_growth(kind: str, argv: list[str]) -> int:
    """Bytes the peak resident set grows by over one round of ``kind``, in a fresh process."""
    out = subprocess.run([sys.executable, __file__, *argv, "--memory", kind], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="vit-ti16")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--train", default="prompts", choices=("prompts", "lora", "dual-prompts"))
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", default="32", choices=("32", "bf16-mixed"),
                   help="bf16-mixed: both kinds' products in bfloat16 over float32 weights (cfl's precision key; the "
                        "loop under torch.autocast)")
    p.add_argument("--client-block", type=int, default=0, help="cfl's client_block (0: the engine's choice)")
    p.add_argument("--loop-last-block", default="whole", choices=("whole", "rows"),
                   help="whole: the loop runs every token through the last block (fed-mammoth's); rows: it runs cfl's "
                        "last block over the head's rows")
    p.add_argument("--memory", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    runner = setup(args)
    if args.memory is not None:  # child: one round's growth of the peak resident set (KiB on Linux)
        Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak resident set (VmHWM) reset to the current
        before = _status_kib("VmRSS")
        cfl_round(runner, 0) if args.memory == "cfl" else loop_round(runner, args)
        print((_status_kib("VmHWM") - before) * 1024)
        return
    cfl_round(runner, 0)  # warm-up of both
    loop_round(runner, args)
    times: dict[str, list[float]] = {"cfl": [], "loop": []}
    for r in range(args.rounds):
        for kind in ("cfl", "loop") if r % 2 == 0 else ("loop", "cfl"):
            start = time.perf_counter()
            cfl_round(runner, r + 1) if kind == "cfl" else loop_round(runner, args)
            times[kind].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}
    pairs = statistics.median(loop / ours for loop, ours in zip(times["loop"], times["cfl"], strict=True))  # neighbours
    queries = runner.stream.info["backbone"].get("queries", {}).get("seconds", 0.0)
    flops = {"cfl": round_flops(lambda: cfl_round(runner, args.rounds + 1)),
             "loop": round_flops(lambda: loop_round(runner, args))}
    flop_ratio = flops["loop"] / flops["cfl"]
    argv = sys.argv[1:]
    memory = {k: peak_growth(k, argv) for k in ("cfl", "loop")}
    tokens = (args.size // 16) ** 2 + 1 + (25 if args.train == "prompts" else 0)  # prefixes add keys, not tokens
    print(json.dumps({"model": args.model, "size": args.size, "train": args.train, "clients": args.clients,
                      "samples": args.samples, "batch": args.batch, "threads": args.threads, "tokens": tokens,
                      "precision": args.precision, "client_block": args.client_block,
                      "path": runner.engine_path.path, "cfl_sec_per_round": best["cfl"],
                      "loop_sec_per_round": best["loop"], "speedup": best["loop"] / best["cfl"],
                      "speedup_median_pair": pairs, "loop_last_block": args.loop_last_block,
                      "cfl_round_flops": flops["cfl"], "loop_round_flops": flops["loop"],
                      "flop_ratio": flop_ratio, "of_flop_ratio": best["loop"] / best["cfl"] / flop_ratio,
                      "query_seconds": queries, "speedup_one_round": best["loop"] / (best["cfl"] + queries),
                      "times": times, "cfl_round_peak_growth_bytes": memory["cfl"],
                      "loop_round_peak_growth_bytes": memory["loop"],
                      "trainable_bytes_per_client": runner.model_bytes, "torch": torch.__version__,
                      "machine": f"{platform.processor() or platform.machine()}, {platform.system()}"}))


if __name__ == "__main__":
    main()
