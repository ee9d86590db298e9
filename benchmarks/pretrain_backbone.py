"""An in-house pretrained backbone for the offline pretrained-methods table: a timm ViT (``--model``, default
ViT-Ti/16) trained from a seeded initialisation on all of Fashion-MNIST's 60,000 training images (10 classes),
at ``--size`` px, for ``--epochs`` epochs, then saved without its classifier as a ``.safetensors`` file that
``model.weights`` loads. **Not ImageNet**: the file stands in for the published ImageNet weights, which cannot be
downloaded here; every table made with it says "in-house backbone, not ImageNet". Its evaluation streams must not
hold Fashion-MNIST (split-digits does not).

The images go through cfl's own preprocessing of a backbone's inputs (:func:`cfl.pretrained.preprocessing.prepared`:
the stream's training range to [0, 1], grayscale to 3 channels, resized with the backbone's interpolation,
normalised by its mean and std), so a run's features are those the backbone was trained on. AdamW (lr ``--lr``,
weight decay 0.05), a cosine schedule after a linear warm-up of 5 % of the steps, batch ``--batch``, no
augmentation; one thread, seeded: the same machine and torch give the same file (its SHA-256 printed, with the
test accuracy on Fashion-MNIST's 10,000 test images and the seconds it took).

    python benchmarks/pretrain_backbone.py --out weights/vit-ti16-fmnist-32.safetensors [--size 32] [--epochs 3]
        [--exclude SWEEP]

``--exclude SWEEP`` (repeatable) leaves out of the pretraining every image that a stream of the sweep's runs holds
(its training and its test images, over every seed of the sweep), compared by content (the images' float32 bytes
after load_idx's normalisation, which the streams keep); refused when a stream's training image is not found among
Fashion-MNIST's (another data root: the comparison would compare nothing). The counts are in the JSON line.
The in-house-backbone table's file (``benchmarks/pretrained/inhouse-fmnist-32.yaml``), measured 2026-12-03 on the
2-core AMD EPYC VM (one thread, beside two other jobs; torch 2.14.1+cu130, timm 1.0.31), the defaults with
``--exclude benchmarks/pretrained/inhouse-fmnist-32.yaml``: 8,566 training images of the sweep's 3 streams left out,
51,434 used, 681 s, Fashion-MNIST test accuracy 86.47 %, SHA-256
febc34cf85b999135e870730ebeccf2e39cf537f5f69d39994d8566cc0d8a7a7. Its joint linear probe on those streams
(``benchmarks/probe_backbone.py``): 85.00 ± 1.13 % over seeds 0, 1, 2, against 74.13 ± 0.40 % for a random
ViT-Ti/16 at 32 px (chance 10 %).

Measured 2026-12-02 on the 2-core AMD EPYC VM (one thread, beside another job; torch 2.14.1, timm 1.0.31), the
defaults: 1,499 s, Fashion-MNIST test accuracy 86.57 %, SHA-256
b24e3a5795fc6dc86f974924c67723b8d2ccb5c5218c950b2f213e70ea5a168d. It transfers to split-digits (class-IL,
5 tasks, 32 px, ``configs/pretrained-digits-head.yaml``) WORSE than a random ViT-Ti/16: FedNCM 54.98 % against
71.11 %, RanPAC 81.32 % against 90.82 % (ACC, seed 0), so it is not a backbone for the digits table; the images
of the two datasets share too little at this size.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # sweep_streams

from cfl.data.load import root_dir  # noqa: E402
from cfl.data.mnist_like import FASHION_MNIST, load_idx  # noqa: E402
from cfl.pretrained.backbones import BACKBONES, require_timm  # noqa: E402
from cfl.pretrained.preprocessing import of_backbone, prepared, unit_range  # noqa: E402
from cfl.pretrained.weights import sha256_of  # noqa: E402


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the .safetensors file to write")
    p.add_argument("--model", default="vit-ti16", choices=sorted(BACKBONES))
    p.add_argument("--size", type=int, default=32, help="input size in pixels (a run sets model.image_size to it)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-root", default=None)
    p.add_argument("--exclude", type=Path, action="append", default=[],
                   help="a sweep file whose streams' images (train and test, every run's seed) the pretraining "
                        "leaves out, compared by content; repeatable")
    return p.parse_args()


def image_keys(x: torch.Tensor) -> set[bytes]:
    """One key per image: its float32 bytes (the streams keep load_idx's normalised values unchanged)."""
    flat = x.reshape(len(x), -1).to(torch.float32).contiguous().numpy()
    return {row.tobytes() for row in flat}


def sweep_images(path: Path, data_root: str | None) -> tuple[set[bytes], set[bytes], int]:
    """The training and the test images of every distinct stream of sweep ``path``'s runs, and how many streams
    that was. The sweep is read with ``model.weights: random`` (the weights it names are the file this makes)."""
    from sweep_streams import per_stream, sweep_configs

    from cfl.data.load import load_stream

    streams = per_stream(sweep_configs(path, "random"))
    train: set[bytes] = set()
    test: set[bytes] = set()
    for cfg in streams:
        fields = cfg.stream_fields()
        stream = load_stream(**{**fields, "data_root": data_root or fields["data_root"]})
        for task in stream.tasks:
            train |= image_keys(task.train_x)
            test |= image_keys(task.test_x)
    return train, test, len(streams)


def held_out(train_x: torch.Tensor, train_y: torch.Tensor, sweeps: list[Path], data_root: str | None
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    """The training images that no stream of ``sweeps`` holds (as a training or a test image, by content), and
    what was left out. Refused when a stream's training image is not among them (the comparison would not be
    one: another data set, or values changed)."""
    if not sweeps:
        return train_x, train_y, {}
    stream_train: set[bytes] = set()
    stream_test: set[bytes] = set()
    counted = 0
    for path in sweeps:
        train, test, n = sweep_images(path, data_root)
        stream_train |= train
        stream_test |= test
        counted += n
    rows = [row.tobytes() for row in train_x.reshape(len(train_x), -1).contiguous().numpy()]
    missing = len(stream_train - set(rows))
    if missing:
        raise SystemExit(f"--exclude {[str(p) for p in sweeps]}: {missing} of the streams' "
                         f"{len(stream_train)} training images are not among Fashion-MNIST's training images: the "
                         f"streams are not built from this data, or their values differ; nothing was trained")
    keep = torch.tensor([row not in stream_train and row not in stream_test for row in rows])
    left_out = {"exclude": [str(p) for p in sweeps], "streams": counted,
                "stream_train_images": len(stream_train), "stream_test_images": len(stream_test),
                "train_images_left_out": int((~keep).sum()), "train_images_used": int(keep.sum())}
    print(f"held out: {left_out}", file=sys.stderr, flush=True)
    return train_x[keep], train_y[keep], left_out


def learning_rate(step: int, total: int, peak: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return 0.5 * peak * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, pre: object, low: torch.Tensor,
             high: torch.Tensor) -> float:
    model.eval()
    right = sum(int((model(prepared(x[i:i + 500], pre, low, high)).argmax(1) == y[i:i + 500]).sum())
                for i in range(0, len(x), 500))
    model.train()
    return 100.0 * right / len(x)


def main() -> None:
    args = arguments()
    if args.out.suffix != ".safetensors":
        raise SystemExit(f"--out must end in .safetensors (got {args.out})")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    timm = require_timm()
    from safetensors.torch import save_file

    (train_x, train_y), (test_x, test_y) = load_idx(FASHION_MNIST, root_dir(args.data_root))
    train_x, train_y, left_out = held_out(train_x, train_y, args.exclude, args.data_root)
    model = timm.create_model(BACKBONES[args.model].timm_name, pretrained=False, num_classes=10, img_size=args.size)
    pre = of_backbone(model, args.size)
    low, high = unit_range([train_x])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    g = torch.Generator().manual_seed(args.seed)
    n = len(train_x)
    steps, step, start = args.epochs * (n // args.batch), 0, time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=g)
        for i in range(n // args.batch):
            rows = order[i * args.batch:(i + 1) * args.batch]
            for group in opt.param_groups:
                group["lr"] = learning_rate(step, steps, args.lr)
            loss = F.cross_entropy(model(prepared(train_x[rows], pre, low, high)), train_y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                print(f"epoch {epoch} step {step}/{steps} loss {loss.item():.4f} "
                      f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    test = accuracy(model, test_x, test_y, pre, low, high)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if not k.startswith("head.")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(args.out))
    print(json.dumps({"out": str(args.out), "sha256": sha256_of(args.out), "model": args.model, "size": args.size,
                      "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "seed": args.seed,
                      "fmnist_test_accuracy": round(test, 2), "train_seconds": round(seconds, 1),
                      "threads": args.threads, **left_out, "torch": torch.__version__, "timm": timm.__version__,
                      "machine": platform.processor() or platform.machine()}))


if __name__ == "__main__":
    main()
