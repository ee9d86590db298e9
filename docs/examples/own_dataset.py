"""A plugin that adds the stream 'blobs-3x2': 6 classes of 10-feature tensors, 3 tasks of 2 classes."""

import torch

from cfl.plugin import Stream, StreamRequest, register_stream, split_tasks


def make_tensors(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Your data as tensors: inputs (n, 10) float32 and labels (n,) int64, class ids 0..5."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 6
    centers = torch.randn(6, 10, generator=torch.Generator().manual_seed(0)) * 2
    return centers[y] + torch.randn(n, 10, generator=gen), y


def build(request: StreamRequest) -> Stream:
    train, test = make_tensors(600, seed=1), make_tensors(300, seed=2)
    class_incremental = request.scenario == "class"
    tasks = split_tasks(train, test, 2, request.num_tasks, class_incremental, "blobs")
    head = 6 if class_incremental else 2
    return Stream("blobs-3x2", request.scenario, tasks, head, (10,), "digits-mlp")


register_stream("blobs-3x2", build, tasks=3, scenarios=("task", "class"), input_shape=(10,), classes_per_task=2,
                default_model="digits-mlp", about="6 Gaussian blobs, 3 tasks of 2 classes (docs/own-dataset.md)")
