"""Server-side synthesis of the data-free methods, timed: one TARGET synthesis round (``g_steps`` generator steps
of the fast/slow pair), TARGET's student distillation per step, and MFCL's generator training per step, against
a teacher with running-stat BatchNorm (the reduced ResNet-18 of the 5-Datasets setups with its BatchNorm layers
keeping running statistics, warmed on random images), on ``--device`` (cpu or cuda). Prints a JSON object.

    python benchmarks/synthesis.py [--device cuda] [--image 32] [--channels 3] [--classes 10] [--nf 20]
        [--target-batch 256] [--g-steps 10] [--mfcl-batch 128] [--mfcl-steps 10] [--kd-steps 10] [--threads 2]

The official presets: TARGET 256 images x 10 steps per round, 10 rounds per task (``--g-steps 10``); MFCL 128
images x 100 steps per task. The figures are per round / per step: multiply by the preset's counts.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from cfl.models.generator import MfclGenerator, TargetGenerator
from cfl.models.resnet import ReducedResNet18
from cfl.ops.synthesis import (
    Logits,
    MfclSettings,
    TargetSettings,
    TargetSynthesizer,
    distil_student,
    normalising,
    train_mfcl_generator,
)
from cfl.ops.synthetic_pool import SyntheticPool
from cfl.ops.target_task_end import fresh_copy


def running_stat_teacher(channels: int, image: int, classes: int, nf: int, device: torch.device) -> nn.Module:
    """The reduced ResNet-18 with running-stat BatchNorm, its statistics warmed on 4 random batches."""
    model = ReducedResNet18(channels, image, classes, 1, False, nf=nf, stem_stride=1, batch_norm="running")
    teacher = Logits(model).to(device).train()
    with torch.no_grad():
        for _ in range(4):
            teacher(torch.randn(64, channels, image, image, device=device))
    return teacher.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--nf", type=int, default=20)
    parser.add_argument("--target-batch", type=int, default=256)
    parser.add_argument("--g-steps", type=int, default=10)
    parser.add_argument("--mfcl-batch", type=int, default=128)
    parser.add_argument("--mfcl-steps", type=int, default=10)
    parser.add_argument("--kd-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    rng = torch.Generator().manual_seed(0)
    teacher = running_stat_teacher(args.channels, args.image, args.classes, args.nf, device)
    classes = torch.arange(args.classes)
    prepare = normalising(torch.full((args.channels,), 0.5), torch.full((args.channels,), 0.25))

    synth = TargetSynthesizer(TargetGenerator(256, 64, args.image, args.channels).to(device),
                              TargetSettings(batch_size=args.target_batch, g_steps=args.g_steps))
    pool = SyntheticPool(10 * args.target_batch)
    synth.synthesize(teacher, None, classes, prepare, rng, pool)  # warm-up (allocations, kernels)
    target_round = synth.synthesize(teacher, None, classes, prepare, rng, pool).seconds

    student = fresh_copy(teacher)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.2, momentum=0.9)
    distil_student(student, teacher, classes, pool, 1, args.target_batch, optimizer, prepare, rng)
    kd = distil_student(student, teacher, classes, pool, args.kd_steps, args.target_batch, optimizer, prepare, rng)

    generator = MfclGenerator(1000, 128, 64, args.image, args.channels).to(device)
    settings = MfclSettings(iterations=args.mfcl_steps, batch_size=args.mfcl_batch)
    train_mfcl_generator(teacher, generator, torch.ones(args.classes, dtype=torch.bool), MfclSettings(
        iterations=1, batch_size=args.mfcl_batch), rng)
    mfcl = train_mfcl_generator(teacher, generator, torch.ones(args.classes, dtype=torch.bool), settings, rng)
    print(json.dumps({
        "device": str(device), "threads": args.threads, "image": [args.channels, args.image, args.image],
        "teacher": f"reduced ResNet-18 nf {args.nf}, running-stat BatchNorm",
        "target_round_seconds": round(target_round, 4), "target_batch": args.target_batch,
        "g_steps": args.g_steps,
        "target_student_step_seconds": round(kd / args.kd_steps, 4),
        "mfcl_step_seconds": round(mfcl.seconds / args.mfcl_steps, 4), "mfcl_batch": args.mfcl_batch,
        "wall_clock": time.strftime("%Y-%m-%d %H:%M:%S"),
    }))


if __name__ == "__main__":
    main()
