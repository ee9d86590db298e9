"""How much of a layer's input energy a GPSE basis holds, sketch width m = d against m = 5d.

For each protected layer of a model on one task's training samples: the exact energy criterion would keep
``eps`` of ``||A||_F^2``; GPSE chooses its directions from a Gaussian sketch ``A G`` (m columns), and the
energy its basis ``B`` really holds is ``||B^T A||_F^2 / ||A||_F^2``. Prints, per layer and width factor,
the mean and minimum over ``--draws`` sketches. One client, first task (no basis yet, r = 1).

    python benchmarks/gpse_sketch_energy.py --model alexnet --stream split-fmnist --samples 1000 --draws 10
"""

from __future__ import annotations

import argparse

import torch

from cfl.data.load import load_stream
from cfl.models import ModelShape, build_model
from cfl.models.layers import protected_layers
from cfl.ops.gpse import client_sketch, server_extend
from cfl.ops.layer_inputs import iter_layer_inputs
from cfl.validation import from_dict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="alexnet")
    ap.add_argument("--stream", default="split-fmnist")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--eps", type=float, default=0.9)
    ap.add_argument("--factors", type=float, nargs="+", default=[1.0, 5.0])
    ap.add_argument("--train-steps", type=int, default=100, help="SGD steps (batch 32, lr 0.01) before measuring")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = from_dict({"stream": {"name": args.stream, "num_tasks": 2}, "model": {"name": args.model},
                     "wandb": {"mode": "disabled"}})
    stream = load_stream(**cfg.stream_fields())
    task = stream.tasks[0]
    model = build_model(args.model, ModelShape(stream.input_shape, stream.classes_per_head, stream.num_tasks,
                                               stream.scenario == "task"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.train_steps):
        idx = torch.randint(len(task.train_y), (32,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(model(task.train_x[idx], torch.zeros(32, dtype=torch.long)),
                                                 task.train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = {k: v.detach() for k, v in model.named_parameters()}
    protected = protected_layers(model)
    x = task.train_x[: args.samples]
    grams = {}
    for block in iter_layer_inputs(model, params, x, 0, protected):
        for name, a in block.items():
            grams[name] = grams.get(name, 0) + a.double() @ a.double().T
    for factor in args.factors:
        widths = {n: max(1, round(factor * g.shape[0])) for n, g in grams.items()}
        held: dict[str, list[float]] = {n: [] for n in grams}
        for draw in range(args.draws):
            blocks = iter_layer_inputs(model, params, x, 0, protected)
            payload = client_sketch(blocks, {}, widths, torch.Generator().manual_seed(draw))
            for name, gram in grams.items():
                basis = server_extend({0: payload[name]}, None, args.eps).basis.double()
                held[name].append(float((basis.T @ gram @ basis).trace() / gram.trace()))
        for name, values in held.items():
            d = grams[name].shape[0]
            print(f"m = {factor:g}d  {name:28s} d={d:5d}  held mean {100 * sum(values) / len(values):6.2f}%  "
                  f"min {100 * min(values):6.2f}%  (target {100 * args.eps:g}%)")


if __name__ == "__main__":
    main()
