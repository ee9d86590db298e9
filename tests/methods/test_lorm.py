"""LoRM (Salami et al., ICLR 2025): the closed-form (RegMean) merge by hand and against the centralised least
squares, one factor trained per round, the merged factors set by the server, the Grams counted, batched equal to
sequential and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cfl.methods.training_hooks import ClientEndContext
from cfl.pretrained.regmean import projected_gram, regmean, shrunk
from tests.helpers import tiny_vit_runner
from tests.run_pairs import assert_batched_equals_sequential


def test_regmean_by_hand():
    # two clients, scalar-free 1 x 2 weights, diagonal Grams: each input coordinate is a weighted mean
    w = torch.tensor([[[1.0, 4.0]], [[3.0, 0.0]]], dtype=torch.float64)
    g = torch.stack([torch.diag(torch.tensor([1.0, 3.0])), torch.diag(torch.tensor([3.0, 1.0]))]).double()
    merged = regmean(w, g)
    # coordinate 0: (1*1 + 3*3) / 4 = 2.5; coordinate 1: (4*3 + 0*1) / 4 = 3
    assert torch.allclose(merged, torch.tensor([[2.5, 3.0]], dtype=torch.float64), atol=1e-12)


def test_regmean_with_equal_grams_is_the_mean():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 5, generator=gen, dtype=torch.float64)
    g = (x.T @ x).expand(3, 5, 5)
    w = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
    assert torch.allclose(regmean(w, g), w.mean(0), atol=1e-10)


def test_regmean_equals_the_centralised_least_squares():
    """The merged weight minimises sum_i ||W X_i^T - W_i X_i^T||^2: the least squares on the union of the clients'
    inputs with every client's own outputs as the targets."""
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in (9, 14, 7)]
    ws = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    merged = regmean(ws, torch.stack([x.T @ x for x in xs]))
    x_all = torch.cat(xs)
    y_all = torch.cat([x @ w.T for x, w in zip(xs, ws, strict=True)])
    central = torch.linalg.lstsq(x_all, y_all).solution.T
    assert (merged - central).abs().max() < 1e-8


def test_the_b_merge_equals_the_centralised_least_squares_of_the_lora_outputs():
    """With A shared, B* = argmin_B sum_i ||B A X_i^T - B_i A X_i^T||^2, from the projected Grams A G_i A^T."""
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in (8, 11)]
    a = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    bs = torch.randn(2, 5, 2, generator=gen, dtype=torch.float64)
    merged = regmean(bs, torch.stack([projected_gram(x.T @ x, a) for x in xs]))
    z_all = torch.cat([x @ a.T for x in xs])  # the B factor's inputs
    y_all = torch.cat([x @ a.T @ b.T for x, b in zip(xs, bs, strict=True)])
    central = torch.linalg.lstsq(z_all, y_all).solution.T
    assert (merged - central).abs().max() < 1e-8


def test_regmean_merges_a_head_per_task_with_the_clients_grams():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)  # (clients, tasks, classes, features)
    x = [torch.randn(9, 5, generator=gen, dtype=torch.float64) for _ in range(2)]
    g = torch.stack([xi.T @ xi for xi in x])
    merged = regmean(w, g)
    assert merged.shape == (3, 4, 5)
    for t in range(3):
        assert torch.allclose(merged[t], regmean(w[:, t], g), atol=1e-12)


def test_shrunk_gram_by_hand():
    g = torch.tensor([[4.0, 2.0], [2.0, 6.0]])
    assert torch.equal(shrunk(g, 0.5), torch.tensor([[4.0, 1.0], [1.0, 6.0]]))
    assert torch.equal(shrunk(g, 1.0), g)


# ---- through the engine: a random ViT-Ti/16 at 16 px (one patch) ----

def config(tmp_path: Path, **extra: object):
    from cfl.validation import from_dict

    data = {"stream": {"name": "split-digits", "num_tasks": 2},
            "model": {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "lora"},
            "method": {"name": "lorm"}, "num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2,
            "batch_size": 8, "lr": 0.01, "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}}
    data.update(extra)
    return from_dict(data)


def runner(cfg):
    return tiny_vit_runner(cfg)




def test_one_factor_trains_per_round_and_the_server_sets_its_regmean_merge(tmp_path):
    pytest.importorskip("timm")
    run = runner(config(tmp_path))
    start = dict(run.params)
    a_keys = [k for k in start if k.endswith(".lora_a")]
    b_keys = [k for k in start if k.endswith(".lora_b")]
    assert len(a_keys) == len(b_keys) == 12
    run.run_round(0, 0)  # trains B (A frozen)
    assert all(torch.equal(run.params[k], start[k]) for k in a_keys)
    assert all(not torch.equal(run.params[k], start[k]) for k in b_keys)
    after_b = dict(run.params)
    run.run_round(0, 1)  # trains A (B frozen)
    assert all(not torch.equal(run.params[k], after_b[k]) for k in a_keys)
    assert all(torch.equal(run.params[k], after_b[k]) for k in b_keys)


def test_each_task_starts_by_training_b(tmp_path):
    """Three rounds of task 0 train B, A, B; the task end sets B again (without it task 1 would start with A)."""
    pytest.importorskip("timm")
    run = runner(config(tmp_path, rounds_per_task=3))
    for rnd in range(3):
        run.run_round(0, rnd)
    run.task_end(0)
    before = dict(run.params)
    run.run_round(1, 0)
    assert all(torch.equal(run.params[k], before[k]) for k in before if k.endswith(".lora_a"))
    assert all(not torch.equal(run.params[k], before[k]) for k in before if k.endswith(".lora_b"))


def test_a_task_end_resets_the_alternation_and_sums_the_clients_task_grams():
    from torch import nn

    from cfl.methods.base import RunInfo
    from cfl.methods.lorm import LoRM, LoRMHyperparams
    from cfl.methods.server_hooks import ServerEvent

    info = RunInfo(num_tasks=2, scenario="class", num_clients=2, clients_per_round=2, seed=0, model=nn.Linear(1, 1))
    server = {"train_b": torch.tensor(0.0)}  # the next round would train A
    uploads = {0: {"task_grams": {"q": torch.eye(2)}}, 1: {"task_grams": {"q": 2 * torch.eye(2)}}}
    method, seen = LoRM(LoRMHyperparams(), info), {}
    method.task_merge = lambda *args: seen.update(args[3])  # the merge: the test below
    method.server_event(ServerEvent("task_end", server, 0, {}, uploads))
    assert float(server["train_b"]) == 1.0
    assert torch.equal(seen["q"], 3 * torch.eye(2, dtype=torch.float64))


def test_lorm_is_refused_under_the_other_schedules(tmp_path):
    from cfl.config.keys import ConfigError

    with pytest.raises(ConfigError, match="method lorm runs under schedule synchronous only: at each task end"):
        config(tmp_path, schedule={"name": "staggered", "group": 2, "offset": 1, "every": 2})


class _OneLayer(torch.nn.Module):
    """A LoRA layer named like a ViT's (rank 1, scale 1) on a 2 x 2 frozen weight, in float64."""

    def __init__(self) -> None:
        from cfl.pretrained.lora import LoRALinear

        super().__init__()
        self.qkv = LoRALinear(torch.nn.Linear(2, 2).double(), rank=1, alpha=1.0)


def test_the_task_merge_into_the_backbone_by_hand():
    """Official end_task_server: Delta_t = (sum_s D_s G_s)(sum_s G_s)^+ over the tasks, D_s a task's weight change
    from the pretrained W0 (in cfl: the merged backbone it trained on plus its factors' B A)."""
    from cfl.methods.base import RunInfo
    from cfl.methods.lorm import LoRM, LoRMHyperparams

    model = _OneLayer()
    method = LoRM(LoRMHyperparams(), RunInfo(num_tasks=3, scenario="class", num_clients=2, clients_per_round=2,
                                             seed=0, model=model))
    d = torch.float64
    server: dict = {"task_gram": {"qkv": torch.diag(torch.tensor([1.0, 3.0], dtype=d))}}
    task0 = {"qkv.lora_a": torch.tensor([[1.0, 2.0]], dtype=d), "qkv.lora_b": torch.tensor([[1.0], [0.0]], dtype=d)}
    update = method.task_merge(model, task0, server, server.pop("task_gram"), 0)
    # one task, a full-rank Gram: the merge is the task's own B A
    assert torch.allclose(update.deltas["qkv.weight"], torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=d), atol=1e-12)
    assert torch.equal(update.params["qkv.lora_b"], torch.zeros(2, 1, dtype=d))  # the official init_matrices
    assert update.params["qkv.lora_a"].abs().max() <= 1 / 2 ** 0.5  # Kaiming-uniform(a=sqrt 5): 1/sqrt(in)
    assert not torch.equal(update.params["qkv.lora_a"], task0["qkv.lora_a"])
    # task 1 trained on W0 + Delta_0 with B A = [[0, 0], [0, 4]]: D_1 = [[1, 2], [0, 4]]; Grams diag(3, 1)
    server["task_gram"] = {"qkv": torch.diag(torch.tensor([3.0, 1.0], dtype=d))}
    task1 = {"qkv.lora_a": torch.tensor([[0.0, 4.0]], dtype=d), "qkv.lora_b": torch.tensor([[0.0], [1.0]], dtype=d)}
    update = method.task_merge(model, task1, server, server.pop("task_gram"), 1)
    # diagonal Grams: each input column is a weighted mean over the tasks, column 0 (1 D_0 + 3 D_1) / 4 = [1, 0],
    # column 1 (3 D_0 + 1 D_1) / 4 = [2, 1]: Delta_1 = [[1, 2], [0, 1]], added as Delta_1 - Delta_0
    assert torch.allclose(update.deltas["qkv.weight"], torch.tensor([[0.0, 0.0], [0.0, 1.0]], dtype=d), atol=1e-12)


def test_the_server_merge_is_regmean_of_the_clients_uploads(tmp_path):
    pytest.importorskip("timm")
    from cfl.methods.lorm import LoRM

    run = runner(config(tmp_path))
    seen = {}
    original = LoRM.server_event

    def spy(self, ctx):
        seen.update(ctx.uploads if ctx.event == "round" else {})
        return original(self, ctx)

    LoRM.server_event = spy
    try:
        run.run_round(0, 0)
    finally:
        LoRM.server_event = original
    layer = "vit.blocks.3.attn.qkv"
    ups = list(seen.values())
    assert len(ups) == 3 and ups[0]["grams"][layer].shape == (4, 4)  # B trained: Grams projected onto A (r = 4)
    expected = regmean(torch.stack([u["factors"][layer] for u in ups]), torch.stack([u["grams"][layer] for u in ups]))
    assert torch.equal(run.params[f"{layer}.lora_b"], expected.float())
    mean = torch.stack([u["factors"][layer] for u in ups]).mean(0)
    assert not torch.allclose(run.params[f"{layer}.lora_b"], mean)  # not FedAvg


def test_bytes_count_the_grams_beside_the_model_upload(tmp_path):
    pytest.importorskip("timm")
    run = runner(config(tmp_path))
    width, rank, layers = 192, 4, 12
    record = run.run_round(0, 0)  # B trained: r x r Grams
    head_gram = width * width * 8
    assert record["round_upload_bytes"] == 3 * (run.model_bytes + layers * rank * rank * 8 + head_gram)
    record = run.run_round(0, 1)  # A trained: the layers' full Grams
    assert record["round_upload_bytes"] == 3 * (run.model_bytes + layers * width * width * 8 + head_gram)


def test_batched_equals_sequential(tmp_path):
    pytest.importorskip("timm")
    runs = [runner(config(tmp_path, client_execution=e)) for e in ("batched", "sequential")]
    for r in runs:
        r.run()
    assert_batched_equals_sequential(*runs)


@pytest.mark.parametrize(("extra", "words"), [
    ({"weight_decay": 0.1}, "set weight_decay: 0"),
    ({"optimizer": {"name": "adam", "state": "kept"}}, "set optimizer.state: fresh"),
    ({"model": {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "prompts"}},
     "method lorm needs model.train: lora"),
    ({"method": {"name": "lorm", "alpha": 0}}, "alpha"),
    ({"method": {"name": "lorm", "alpha_backbone": 1.5}}, "alpha_backbone"),
    ({"model": {"name": "digits-mlp"}}, "lorm"),
])
def test_refusals(tmp_path, extra, words):
    from cfl.config.keys import ConfigError

    with pytest.raises(ConfigError, match=words):
        config(tmp_path, **extra)


def test_a_task_end_merges_the_task_into_the_shared_backbone_and_restarts_the_factors(tmp_path, capsys):
    """After task 0 the backbone's qkv weight is W0 + (scale B A G) G^+ (B, A the task's final factors, G the
    participants' summed Grams), the factors restart (B zero, A new), the next task trains on that backbone, and
    the change is said on stderr and kept for results.json."""
    pytest.importorskip("timm")
    from cfl.pretrained.lora import LoRALinear

    run = runner(config(tmp_path))
    layer = "vit.blocks.5.attn.qkv"
    lora = dict(run.model.named_modules())[layer]
    assert isinstance(lora, LoRALinear)
    w0 = lora.weight.clone()
    for rnd in range(2):
        run.run_round(0, rnd)
    a, b = run.params[f"{layer}.lora_a"].double(), run.params[f"{layer}.lora_b"].double()
    run.task_end(0)
    gram = run.states[0].server["task_merge"]["gram"][layer]
    expected = w0.double() + (lora.scale * b @ a @ gram) @ torch.linalg.pinv(gram, hermitian=True)
    assert (lora.weight.double() - expected).abs().max() < 1e-6
    assert not torch.equal(lora.weight, w0)
    assert torch.equal(run.params[f"{layer}.lora_b"], torch.zeros_like(run.params[f"{layer}.lora_b"]))
    assert not torch.equal(run.params[f"{layer}.lora_a"].double(), a)
    change = run.progress.backbone_changes
    assert len(change) == 1 and change[0]["method"] == "lorm" and len(change[0]["tensors"]) == 12
    assert change[0]["bytes"] == 12 * 576 * 192 * 4
    assert "backbone: method lorm changed 12 tensors of the shared frozen backbone at the end of task 0" in \
        capsys.readouterr().err
    from cfl.metrics.results import build_results

    assert build_results(run.snapshot(), 0.0)["backbone_changes"] == change
    merged = lora.weight.clone()
    run.run_round(1, 0)
    assert torch.equal(lora.weight, merged)  # the clients train on it; nothing writes into it in a round


def test_the_changed_backbone_is_downloaded_once_by_each_client_at_its_next_round(tmp_path):
    pytest.importorskip("timm")
    run = runner(config(tmp_path))
    first = run.run_round(0, 0)["round_download_bytes"]  # a B round, like task 1's first
    run.run_round(0, 1)
    run.task_end(0)
    changed = 12 * 576 * 192 * 4
    assert run.run_round(1, 0)["round_download_bytes"] == first + 3 * changed
    before = {j.cid for j in run.schedule.round_jobs(1, 0)}
    new = [j.cid for j in run.schedule.round_jobs(1, 1) if j.cid not in before]
    assert run.run_round(1, 1)["round_download_bytes"] == first + len(new) * changed  # those not sampled before
    assert run.comm.lines["shared_backbone"] == (3 + len(new)) * changed


class _WithHead(_OneLayer):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(2, 2).double()

    def forward(self, x, task):
        return self.head(self.qkv(x))


def test_a_b_round_sends_the_full_gram_projected_on_a_by_hand():
    """A ``B`` round's Gram is ``A G A^T`` of the whole input Gram ``G = X^T X`` (off-diagonal entries included)."""
    from cfl.methods.base import ClientData, RunInfo
    from cfl.methods.lorm import TRAIN_B, LoRM, LoRMHyperparams

    model = _WithHead().double()
    method = LoRM(LoRMHyperparams(alpha=1.0), RunInfo(num_tasks=2, scenario="class", num_clients=1,
                                                        clients_per_round=1, seed=0, model=model))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["qkv.lora_a"] = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    x = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)  # G = [[1, 1], [1, 2]]
    data = ClientData(x, torch.tensor([0, 1]), 0)
    upload = method.client_end(ClientEndContext("round", model, params, data, {}, {TRAIN_B: torch.tensor(1.0)},
                                                torch.Generator()))
    # A G A^T = 1 + 1 + 1 + 2 = 5 (from diag(G) alone: 3)
    assert upload["grams"]["qkv"].tolist() == [[5.0]]
    assert projected_gram(torch.tensor([[1.0, 1.0], [1.0, 2.0]]), torch.tensor([[1.0, 1.0]])).item() == 5.0


def test_alpha_backbone_regularises_the_lora_grams_alone_by_hand():
    """``alpha_backbone: 0`` (the official README's ``alpha_regmean_backbone=0``) sends the diagonal of each LoRA
    layer's input Gram, in the round and at the task end, while the head's Gram keeps ``alpha``."""
    from cfl.methods.base import ClientData, RunInfo
    from cfl.methods.lorm import TRAIN_B, LoRM, LoRMHyperparams

    model = _WithHead().double()
    model.qkv.weight.copy_(torch.eye(2, dtype=torch.float64))  # the frozen base: the head's inputs are the qkv's
    model.qkv.bias.zero_()
    method = LoRM(LoRMHyperparams(alpha=0.5, alpha_backbone=0.0), RunInfo(
        num_tasks=2, scenario="class", num_clients=1, clients_per_round=1, seed=0, model=model))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["qkv.lora_b"] = torch.zeros_like(params["qkv.lora_b"])  # B = 0: the qkv's output is its input
    x = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)  # G = [[1, 1], [1, 2]]
    data = ClientData(x, torch.tensor([0, 1]), 0)

    def end(event: str) -> dict:
        return method.client_end(ClientEndContext(event, model, params, data, {}, {TRAIN_B: torch.tensor(0.0)},
                                                  torch.Generator()))

    upload = end("round")  # an A round: the Gram of the inputs themselves
    assert upload["grams"]["qkv"].tolist() == [[1.0, 0.0], [0.0, 2.0]]
    assert upload["head_gram"].tolist() == [[1.0, 0.5], [0.5, 2.0]]  # alpha 0.5 on the off-diagonal entries
    assert end("task_end")["task_grams"]["qkv"].tolist() == [[1.0, 0.0], [0.0, 2.0]]
    method.hparams = LoRMHyperparams(alpha=0.5)  # null: the LoRA layers' Grams take alpha too
    assert end("round")["grams"]["qkv"].tolist() == [[1.0, 0.5], [0.5, 2.0]]
