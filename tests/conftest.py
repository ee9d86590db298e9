"""Shared fixtures: tiny in-memory streams and configs that run in well under a second."""

from __future__ import annotations

import pytest
import torch

from cfl.data.stream import Stream, Task
from cfl.validation import from_dict


def make_stream(scenario: str = "task", num_tasks: int = 2, n_train: int = 60, n_test: int = 30,
                dim: int = 12, classes: int = 3, seed: int = 0, image: tuple[int, ...] = (),
                model: str = "digits-mlp") -> Stream:
    """Linearly separable Gaussian blobs, one set per task (class-dependent, so models can learn them); ``image``:
    inputs of that shape (``dim`` is then its size), for ``model``."""
    dim = int(torch.Size(image).numel()) if image else dim
    gen = torch.Generator().manual_seed(seed)
    tasks = []
    for t in range(num_tasks):
        centers = torch.randn(classes, dim, generator=gen) * 0.7
        def draw(n: int, centers: torch.Tensor = centers) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.arange(n) % classes
            return (centers[y] + torch.randn(n, dim, generator=gen)).view(n, *(image or (dim,))), y
        (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
        offset = t * classes if scenario == "class" else 0
        tasks.append(Task(f"blob-{t}", xtr, ytr + offset, xte, yte + offset,
                          list(range(offset, offset + classes))))
    head = classes * num_tasks if scenario == "class" else classes
    return Stream("blobs", scenario, tasks, head, image or (dim,), model)


def tiny_config(**overrides: object):
    data = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 6, "clients_per_round": 4,
            "rounds_per_task": 3, "batch_size": 8, "lr": 0.05, "wandb": {"mode": "disabled"}}
    method = overrides.get("method")
    data.update(METHOD_CONFIGS.get(method["name"], {}) if isinstance(method, dict) else {})
    for key, value in overrides.items():
        data[key] = value
    return from_dict(data)


#: what the registry-wide tests (each method of METHODS) give a method beyond its name: GLFC runs class-incremental
#: streams there, its own form (its task- and domain-incremental adaptation: tests/methods/test_glfc_by_task.py and
#: test_glfc_runs_alike_in_both_engines_on_task_and_domain_streams), of square images (its LeNet encodes them: 16
#: inputs are a 4x4 image), here with a small memory and a short proxy server
METHOD_SETTINGS = {"fedicarl": {"memory_size": 6},
                   "glfc": {"memory_size": 6, "perturb_steps": 1, "reconstruction_steps": 1, "reconstructions_kept": 1,
                            "reconstruction_iterations": 2},
                   "target": {"syn_rounds": 2, "warmup": 1, "g_steps": 2, "synthesis_batch": 4, "nz": 8, "ngf": 4,
                              "nums": 8, "synthetic_batch": 3, "kd_steps": 1, "student_batch": 4}}
METHOD_STREAMS = {"glfc": {"scenario": "class", "dim": 16},
                  "fedweit": {"scenario": "task"},  # FedWeIT: task-incremental only (one head per task)
                  "fedicarl": {"scenario": "class"},  # FediCaRL: class-incremental only (iCaRL)
                  # TARGET: class-incremental, images for its generator, a model with BatchNorm running statistics
                  "target": {"scenario": "class", "dim": 256, "image": (1, 16, 16), "n_train": 24, "n_test": 6,
                             "model": "resnet18-reduced-running-bn"},
                  # MFCL: likewise, its generator's square images
                  "mfcl": {"scenario": "class", "dim": 144, "image": (1, 12, 12),
                           "model": "resnet18-reduced-running-bn"}}
METHOD_STREAMS.update({name: {"dim": 192, "model": "vit-ti16"} for name in ("fedncm", "afcl", "ranpac")})
#: RanPAC: a projection wider than the features (192), its Gram small
METHOD_SETTINGS["ranpac"] = {"projection_dim": 256}
#: MFCL: a tiny generator
METHOD_SETTINGS["mfcl"] = {"syn_size": 4, "generator_steps": 2, "generator_batch": 4, "nz": 8, "generator_width": 8,
                           "generator_hidden": 4}

#: the config keys a method's registry-wide runs need (tiny_config): TARGET a model with running statistics, on a
#: class-incremental image stream (split-fmnist validates it; the tests run on stream_for's in-memory images)
METHOD_CONFIGS = {"target": {"stream": {"name": "split-fmnist", "num_tasks": 2, "scenario": "class"},
                             "model": {"name": "resnet18-reduced-running-bn"}},
                  # MFCL: its model is model: auto's; the running-stat ResNet does not fit split-digits' 8x8 images
                  "mfcl": {"stream": {"name": "split-fmnist", "num_tasks": 2, "scenario": "class"}},
                  # FediCaRL: class-incremental only
                  "fedicarl": {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class"}}}
#: the closed-form classifiers on a pretrained backbone's features (a random ViT-Ti/16 at 32 px; extra pretrained):
#: their registry-wide runs take blobs of the backbone's feature width in place of its cached features
for _name in ("fedncm", "afcl", "ranpac"):
    METHOD_CONFIGS[_name] = {"model": {"name": "vit-ti16", "weights": "random", "image_size": 32}, "lr": 0.01}
#: the adapters trained through a random ViT-Ti/16 at 16 px (one patch): images of 3 x 8 x 8, resized in the model
METHOD_CONFIGS["l2p"] = {"model": {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "prompts",
                                   "prompt_pool": 4, "prompt_length": 2, "prompt_top_k": 2}, "lr": 0.01}
METHOD_CONFIGS["lora"] = {"model": {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "lora"},
                          "lr": 0.01}
METHOD_CONFIGS["lorm"] = {**METHOD_CONFIGS["lora"]}
METHOD_CONFIGS["pilora"] = {"model": {**METHOD_CONFIGS["lora"]["model"], "lora_targets": "qv", "lora_layers": 1,
                                      "lora_tasks": "per-task", "classifier": "prototype"},
                            "lr": 0.01, "optimizer": {"name": "adam"}}
METHOD_CONFIGS["codap"] = {"model": {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "components",
                                     "prompt_pool": 4, "prompt_length": 2}, "lr": 0.01}
METHOD_CONFIGS["fedcprompt"] = {**METHOD_CONFIGS["codap"], "weight_decay": 0.0}
METHOD_CONFIGS["dualprompt"] = {"model": {"name": "vit-ti16", "weights": "random", "image_size": 16,
                                          "train": "dual-prompts", "prompt_pool": 4, "prompt_length": 2,
                                          "prompt_top_k": 1, "g_prompt_length": 2, "g_prompt_layers": 1,
                                          "e_prompt_layers": 2}, "lr": 0.01, "weight_decay": 0.0}
#: Powder: task-incremental (each input's prompt is composed from its task's row of the task correlation)
METHOD_CONFIGS["powder"] = {"model": {"name": "vit-ti16", "weights": "random", "image_size": 16,
                                      "train": "task-components", "prompt_pool": 2, "prompt_length": 2,
                                      "prompt_blocks": [0, 1]}, "lr": 0.01, "weight_decay": 0.0,
                            "stream": {"name": "split-digits", "num_tasks": 2, "scenario": "task"}}
#: Fed-CPrompt: C2L's scales 1e3 / 1e1 (the code's, for ViT-B/16 features) blow a random tiny ViT's keys up to ~20 in
#: a few steps, where float32 summation order alone differs by 1e-4 between the engines; 1 / 0.1 keep them small
METHOD_SETTINGS["fedcprompt"] = {"pull": 1.0, "push": 0.1}
METHOD_STREAMS.update({name: {"dim": 192, "image": (3, 8, 8), "model": "vit-ti16"}
                       for name in ("l2p", "lora", "lorm", "pilora", "codap", "fedcprompt", "dualprompt", "powder")})
METHOD_STREAMS["powder"]["scenario"] = "task"  # Powder: task-incremental only


def any_method_models() -> list[str]:
    """The registered models every method may train (not a method's own family, e.g. FedWeIT's networks, which
    their method alone trains: tests/methods/test_fedweit_engine.py)."""
    from cfl.cross_checks import model_family_error
    from cfl.models import MODELS
    from cfl.pretrained.backbones import is_backbone

    # a pretrained backbone's model is a head on its cached features (tests/pretrained/test_pretrained.py)
    return [n for n in MODELS if model_family_error(n, ["fedavg"]) is None and not is_backbone(n)]


def method_spec(name: str) -> dict:
    """``method:`` for method ``name`` in a registry-wide test."""
    return {"name": name, **METHOD_SETTINGS.get(name, {})}


def stream_for(name: str, scenario: str = "task", **kwargs: int) -> Stream:
    """:func:`make_stream` for method ``name`` in a registry-wide test (its scenario and input size where it needs
    its own)."""
    return make_stream(**{"scenario": scenario, **kwargs, **METHOD_STREAMS.get(name, {})})


@pytest.fixture
def blobs() -> Stream:
    return make_stream()


def changes_training(make_cfg, method: dict) -> bool:
    """Whether ``method`` trains a two-task domain stream to other weights than FedAvg (its penalty acts)."""
    from cfl.engine.rounds.runner import Runner

    stream = make_stream("domain", num_tasks=2)
    plain, other = Runner(make_cfg(method={"name": "fedavg"}), stream), Runner(make_cfg(method=method), stream)
    plain.run()
    other.run()
    return not torch.allclose(plain.params["body.1.weight"], other.params["body.1.weight"])


def run_both_paths(make_cfg, stream: Stream, **kw):
    """Run ``make_cfg(client_execution=..., **kw)`` batched and sequential; assert they agree.

    Parameters must match within float tolerance and the accuracy matrices exactly. Returns both runners.
    """
    from cfl.engine.rounds.runner import Runner

    runs = []
    for execution in ("batched", "sequential"):
        runner = Runner(make_cfg(client_execution=execution, **kw), stream)
        runner.run()
        runs.append(runner)
    batched, sequential = runs
    for k in batched.params:
        assert torch.allclose(batched.params[k], sequential.params[k], atol=1e-5, rtol=1e-4), k
    assert batched.progress.acc_matrix == sequential.progress.acc_matrix
    return batched, sequential


@pytest.fixture(autouse=True, scope="session")
def _probe_cache_in_a_temporary_directory(tmp_path_factory):
    """bf16-mixed's speed probe (cfl/engine/local/bf16_probe.py) caches its rates here, not in the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CFL_PROBE_CACHE", str(tmp_path_factory.mktemp("probe") / "bf16_probe.json"))
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` the tests :data:`tests.slow_tests.SLOW` names (``make check`` deselects them); an entry that
    matches no test of a file that was collected is refused, so the list cannot go stale silently."""
    from tests.slow_tests import SLOW

    slow = pytest.mark.slow
    used: set[str] = set()
    for item in items:
        entry = next((e for e in SLOW if item.nodeid.startswith(e)), None)
        if entry is not None:
            item.add_marker(slow)
            used.add(entry)
    collected = {item.nodeid.split("::")[0] for item in items}
    whole_files = not (config.option.keyword or config.option.deselect or any("::" in a for a in config.args))
    stale = [e for e in SLOW if whole_files and e not in used and e.split("::")[0] in collected]
    if stale:
        raise pytest.UsageError(f"tests/slow_tests.py names tests that do not exist: {', '.join(stale)}; rename or "
                                "remove the entries")


def penalty_of(method, global_params, server, state):
    """``method.round_terms``' penalty of one client (None: none), as the engine asks it."""
    from cfl.methods.base import ClientRound

    terms = method.round_terms(ClientRound("penalty", state, global_params, server))
    return None if terms is None else terms.penalty


def carry_start_of(method, global_params, state, server=None):
    """``method.client_start``'s carry of one client (``{}``: none), as the engine asks it."""
    from cfl.methods.base import ClientRoundStart

    start = method.client_start(ClientRoundStart("carry", server or {}, state, global_params=global_params))
    return {} if start is None or start.carry is None else start.carry


def steps_of(method, num_samples, server):
    """``method.client_start``'s local steps per epoch (None: all the batches), as the engine asks it."""
    from cfl.methods.base import ClientRoundStart

    start = method.client_start(ClientRoundStart("steps", server, num_samples=num_samples))
    return None if start is None else start.steps
