"""GLFC's proxy server: a round's reconstructions one at a time (``torch.optim.LBFGS`` per uploaded gradient) against
all of them in lockstep (:func:`cfl.ops.glfc_proxy.reconstruct_all`), docs/methods/glfc.md, "Costs, counted and
timed". The gradients are the fixed random LeNet's at random images with labels 0, 1, ...; both start from the same
N(0, 1) draws. Prints a JSON object.

    python benchmarks/glfc_reconstruction.py [--gradients 30] [--shape 784] [--steps 5] [--threads 1] [--device cpu]
        [--double]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from cfl.models.lenet import GradientLeNet, uniform_init_
from cfl.ops.glfc_proxy import encoder_gradient, gradient_distance, infer_label, reconstruct_all


def one_at_a_time(encoder: torch.nn.Module, targets: list, shape: tuple[int, ...], generator: torch.Generator,
                  steps: int) -> torch.Tensor:
    """The reference: torch.optim.LBFGS(lr 0.1) on each gradient alone, the final iterates."""
    finals = []
    for target in targets:
        x = torch.randn((1, *shape), generator=generator, dtype=target[0].dtype).to(target[0].device)
        x.requires_grad_(True)
        y = torch.tensor([infer_label(target[-2])], device=x.device)
        optimizer = torch.optim.LBFGS([x], lr=0.1)

        def closure(x: torch.Tensor = x, y: torch.Tensor = y, target: list = target) -> torch.Tensor:
            grads = torch.autograd.grad(F.cross_entropy(encoder(x), y), list(encoder.parameters()), create_graph=True)
            distance = gradient_distance(grads, target)
            (x.grad,) = torch.autograd.grad(distance, [x])
            return distance.detach()

        for _ in range(steps):
            optimizer.step(closure)
        finals.append(x.detach().flatten())
    return torch.stack(finals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradients", type=int, default=30)
    parser.add_argument("--shape", type=int, nargs="+", default=[784])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--double", action="store_true", help="float64 (the two agree to rounding; in float32 the "
                        "ill-conditioned matching grows rounding differences between the two into visible ones)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape, device = tuple(args.shape), torch.device(args.device)
    dtype = torch.float64 if args.double else torch.float32
    encoder = uniform_init_(GradientLeNet(shape, 10), torch.Generator().manual_seed(0)).to(device, dtype)
    images = torch.rand((args.gradients, *shape), generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    targets = [encoder_gradient(encoder, images[i], i % 10) for i in range(args.gradients)]
    reconstruct_all(encoder, targets[:1], shape, torch.Generator().manual_seed(2), 1, keep=1)  # warm-up
    start = time.perf_counter()
    recs = reconstruct_all(encoder, targets, shape, torch.Generator().manual_seed(2), args.steps, keep=1)
    together = time.perf_counter() - start
    start = time.perf_counter()
    reference = one_at_a_time(encoder, targets, shape, torch.Generator().manual_seed(2), args.steps)
    alone = time.perf_counter() - start
    finals = torch.stack([r.samples[-1].flatten() for r in recs])
    print(json.dumps({"gradients": args.gradients, "shape": list(shape), "steps": args.steps,
                      "threads": args.threads, "device": str(device), "dtype": str(dtype),
                      "one_at_a_time_s": round(alone, 3), "together_s": round(together, 3),
                      "final_distance_together_mean": sum(r.final_distance for r in recs) / len(recs),
                      "max_abs_difference_of_final_iterates": float((finals - reference).abs().max())}))


if __name__ == "__main__":
    main()
