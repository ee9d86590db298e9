"""A backbone's joint linear-probe accuracy on a sweep's evaluation streams: what its frozen features can
separate at all, with every class of every task seen together (no continual learning, no federation), the upper
line a pretrained-methods table reads its rows against.

For each distinct stream of the sweep's runs (one per seed), the frozen backbone's features of every training and
test sample (cfl's feature stream: the same preprocessing and cache as a ``model.train: head`` run), then a
multinomial logistic regression (scikit-learn, lbfgs, C ``--c``, standardised features) fitted on all tasks'
training features and scored on all tasks' test features. ``--weights random`` probes the untrained backbone of
the same architecture (initialised from each run's seed) for comparison.

    python benchmarks/probe_backbone.py benchmarks/pretrained/inhouse-fmnist-32.yaml [--weights random]

Prints one JSON line per seed and one with the mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_streams import per_stream, sweep_configs  # noqa: E402

from cfl.data.load import load_stream  # noqa: E402
from cfl.pretrained.features import feature_stream  # noqa: E402


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="a sweep file whose base names a pretrained backbone")
    p.add_argument("--weights", default=None, help="random: probe the untrained backbone instead of the file")
    p.add_argument("--c", type=float, default=1.0, help="inverse L2 strength of the logistic regression")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def head_configs(path: Path, weights: str | None) -> list:
    """One config per distinct stream of the sweep's runs that train a head on frozen features, ``model.weights``
    replaced by ``weights`` when given."""
    configs = per_stream([cfg for cfg in sweep_configs(path, weights) if cfg.model.train == "head"])
    if not configs:
        raise SystemExit(f"{path}: no run of the sweep trains a head on frozen features (model.train: head)")
    return configs


def probe(cfg: object, c: float) -> dict[str, object]:
    """The joint linear probe's test accuracy (%) on ``cfg``'s stream."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    raw = load_stream(**cfg.stream_fields(), device=torch.device("cpu"))
    stream = feature_stream(cfg, raw, torch.device("cpu"), quiet=True)
    train_x = torch.cat([t.train_x for t in stream.tasks]).numpy()
    train_y = torch.cat([t.train_y for t in stream.tasks]).numpy()
    test_x = torch.cat([t.test_x for t in stream.tasks]).numpy()
    test_y = torch.cat([t.test_y for t in stream.tasks]).numpy()
    start = time.perf_counter()
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000)).fit(train_x, train_y)
    return {"seed": cfg.seed, "stream": cfg.stream.name, "classes": int(len(set(train_y.tolist()))),
            "train": len(train_y), "test": len(test_y), "weights": cfg.model.weights,
            "sha256": stream.info["backbone"]["sha256"],
            "probe_accuracy": round(100.0 * float((model.predict(test_x) == test_y).mean()), 2),
            "fit_seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    rows = [probe(cfg, args.c) for cfg in head_configs(args.sweep, args.weights)]
    for row in rows:
        print(json.dumps(row))
    accuracies = [float(r["probe_accuracy"]) for r in rows]
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    print(json.dumps({"mean_probe_accuracy": round(statistics.mean(accuracies), 2), "std": round(spread, 2),
                      "seeds": [r["seed"] for r in rows], "c": args.c}))


if __name__ == "__main__":
    main()
