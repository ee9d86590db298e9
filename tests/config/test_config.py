import os
from pathlib import Path

import pytest

from cfl.config.keys import Config
from cfl.config.schema import ConfigError
from cfl.config.yaml_files import parse_overrides, read_yaml
from cfl.cross_checks import THREADS_PER_CPU, model_fit_error
from cfl.data.load import load_stream
from cfl.data.stream_registry import STREAMS
from cfl.engine.stores.checkpoint import check_config
from cfl.validation import from_dict, load_config
from tests import fake_data
from tests.data.test_streams import WRITERS

BAD = [
    ({"nope": 1}, "unknown config key 'nope'"),
    ({"stream": {"nmae": "x"}}, "unknown config key 'stream.nmae'"),
    ({"stream": {"name": "imagenet-22k"}}, "unknown stream 'stream.name: imagenet-22k'; available: "),
    ({"stream": {"num_tasks": 0}}, "'stream.num_tasks' must be >= 1"),
    ({"stream": {"num_tasks": 99}}, "has 5 tasks"),
    ({"stream": {"scenario": "domain"}}, "not supported by stream"),
    ({"stream": {"scenario": "sideways"}}, "'stream.scenario' must be one of"),
    ({"stream": "digits"}, "'stream' must be a mapping"),
    ({"model": {"name": "vit"}}, "unknown model 'model.name: vit'; available: auto, mlp"),
    ({"partition": {"name": "random"}}, "unknown partitioner 'partition.name: random'; available: iid"),
    ({"partition": {"alpha": 0}}, "'partition.alpha' must be > 0"),
    ({"partition": {"shards_per_client": 0}}, "'partition.shards_per_client' must be >= 1"),
    ({"num_clients": 0}, "'num_clients' must be >= 1"),
    ({"num_clients": "ten"}, "'num_clients' must be an integer"),
    ({"num_clients": 2.5}, "'num_clients' must be an integer"),
    ({"num_clients": True}, "'num_clients' must be an integer"),
    ({"num_clients": 5, "clients_per_round": 6}, "exceeds 'num_clients'"),
    ({"rounds_per_task": -1}, "'rounds_per_task' must be >= 1"),
    ({"local_epochs": 0}, "'local_epochs' must be >= 1"),
    ({"batch_size": 0}, "'batch_size' must be >= 1"),
    ({"lr": 0}, "'lr' must be > 0"),
    ({"lr": "fast"}, "'lr' must be a number"),
    ({"weight_decay": -0.1}, "'weight_decay' must be >= 0"),
    ({"momentum": 1.5}, "'momentum' must be <= 0.999"),
    ({"server_lr": 0}, "'server_lr' must be > 0"),
    ({"loss": "mse"}, "unknown loss 'loss: mse'; available: ce, tce"),
    ({"method": {"name": "magic"}}, "unknown method 'method.name: magic'; available: fedavg"),
    ({"method": {}}, "'method.name' is required"),
    ({"method": {"name": "fedavg", "mu": 0.1}}, "unknown config key 'method.mu'"),
    ({"method": {"name": "fedprox", "mu": -1}}, "'method.mu' must be >= 0"),
    ({"plugins": [{"name": "fedprox"}, {"name": "fedprox"}]}, "appears twice"),
    ({"plugins": ["fedprox"]}, "'plugins[0]' must be a mapping"),
    ({"aggregator": {"name": "median"}}, "unknown aggregator 'aggregator.name: median'; available: mean, gma"),
    ({"aggregator": {"tau": 2}}, "'aggregator.tau' must be <= 1"),
    ({"eval_every": -1}, "'eval_every' must be >= 0"),
    ({"target_accuracies": [50, 120]}, "'target_accuracies' must be <= 100"),
    ({"device": "tpu"}, "'device' must be cpu, cuda or cuda:N"),
    ({"wandb": {"mode": "sometimes"}}, "'wandb.mode' must be one of"),
    ({"client_execution": "parallel"}, "'client_execution' must be one of"),
    ({"on_nonfinite": "ignore"}, "'on_nonfinite' must be one of"),
    ({"seed": -3}, "'seed' must be >= 0"),
    ({"stream": {"seed": 2**70}}, "'stream.seed' must be a 64-bit integer"),
    ({"stream": {"seed": "x"}}, "'stream.seed' must be int or null"),
    ({"method": {"name": "er", "replay_batch_size": 2**64}}, "'method.replay_batch_size' must be a 64-bit integer"),
]


@pytest.mark.parametrize(("data", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_config_is_refused_with_the_key_named(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert message in str(err.value)


def test_defaults_and_method_params_are_filled():
    cfg = from_dict({"method": {"name": "fedprox"}})
    assert isinstance(cfg, Config)
    assert cfg.method == {"name": "fedprox", "mu": 0.01}


def test_overrides_are_parsed_as_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num_clients: 8\nclients_per_round: 4\n")
    cfg = load_config(path, ["lr=0.2", "partition.name=shards", "method.name=fedprox", "method.mu=0.5"])
    assert cfg.lr == 0.2 and cfg.partition.name == "shards" and cfg.method["mu"] == 0.5


@pytest.mark.parametrize("item", ["lr", "=3", "a..b=1", ".x=1"])
def test_malformed_set_is_refused(item):
    with pytest.raises(ConfigError, match="malformed --set"):
        parse_overrides([item])


def test_missing_and_broken_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("lr: [0.1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


def test_non_finite_floats_are_refused_and_1e_minus_3_is_a_number():
    assert from_dict({"lr": "1e-3"}).lr == 0.001  # YAML 1.1 reads 1e-3 as a string
    for value in (float("nan"), float("inf"), "1e400", 10**400):
        with pytest.raises(ConfigError, match="'lr' must be a finite number"):
            from_dict({"lr": value})


def test_bounds_are_inclusive():
    cfg = from_dict({"seed": 2**32 - 1, "stream": {"name": "permuted-digits", "seed": 2**32 - 1}, "batch_size": 2**20,
                     "threads": THREADS_PER_CPU * (os.cpu_count() or 1)})
    assert cfg.seed == 2**32 - 1 and cfg.batch_size == 2**20


def test_model_auto_is_resolved_to_the_streams_reference_model():
    assert from_dict({"stream": {"name": "split-digits"}}).model.name == "digits-mlp"
    assert from_dict({"stream": {"name": "split-cifar100"}}).to_dict()["model"]["name"] == "alexnet"


def test_a_checkpoint_saved_with_model_auto_still_resumes():
    cfg = from_dict({"stream": {"name": "split-digits"}})
    saved = cfg.to_dict()
    saved["model"]["name"] = "auto"
    check_config(saved, cfg, Path("run"))  # no "no longer matches"
    saved["model"]["name"] = "mlp"
    with pytest.raises(ConfigError, match="model.name: 'mlp' in the checkpoint"):
        check_config(saved, cfg, Path("run"))


@pytest.mark.parametrize("name", list(STREAMS))
def test_every_streams_reference_model_fits_it_in_every_scenario(name):
    from cfl.pretrained.backbones import is_backbone

    entry = STREAMS[name]
    if is_backbone(entry.default_model):  # a pretrained ViT resizes any image (check_model_fits skips it too)
        assert len(entry.input_shape) == 3 and entry.input_shape[0] == 3
        return
    for scenario in entry.scenarios:
        assert model_fit_error(entry.default_model, name, scenario, None) is None


#: writers of small generated data files for every stream that needs files (the digits are bundled)
FAKE_FILES = {**WRITERS, "permuted-digits": lambda _: None, "split-digits": lambda _: None,
              "permuted-fmnist": lambda r: fake_data.write_idx_dataset(r / "fashion-mnist", gz=False),
              "split-fmnist": lambda r: fake_data.write_idx_dataset(r / "fashion-mnist", gz=False),
              # 14 images per class: the fixed 80/20 split leaves each of the 2 tasks' 40 classes a test image
              "imagenet-r": lambda r: fake_data.write_imagenet_r(r, classes=40, per_class=14),
              "cub-200": lambda r: fake_data.write_cub(r, classes=40, per_class=2),
              "domainnet": fake_data.write_domainnet}


@pytest.mark.parametrize(("name", "scenario"), [(n, s) for n, e in STREAMS.items() for s in e.scenarios])
def test_stream_metadata_matches_the_built_stream(name, scenario, tmp_path):
    """The shape facts the validation uses without data agree with every stream as loaded."""
    from cfl.pretrained.backbones import is_backbone

    FAKE_FILES[name](tmp_path)
    model = {"model": {"name": "mlp"}} if is_backbone(STREAMS[name].default_model) else {}  # no weights needed
    cfg = from_dict({"stream": {"name": name, "scenario": scenario, "num_tasks": 2}, "data_root": str(tmp_path),
                     **model})
    stream, entry = load_stream(**cfg.stream_fields()), STREAMS[name]
    assert stream.input_shape == entry.input_shape and tuple(stream.tasks[0].train_x.shape[1:]) == entry.input_shape
    assert stream.classes_per_head == entry.head_classes(stream.scenario)
    assert stream.default_model == entry.default_model


def test_duplicate_keys_are_refused_but_merge_keys_may_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("stream:\n  name: split-digits\n  name: permuted-digits\n")
    with pytest.raises(ConfigError, match="key 'name' is given twice in one mapping \\(lines 2 and 3\\)"):
        load_config(path)
    path.write_text("defaults: &d {lr: 0.1, seed: 3}\n")
    assert read_yaml(path) == {"defaults": {"lr": 0.1, "seed": 3}}
    path.write_text("a: &d {lr: 0.1, seed: 3}\nb:\n  <<: *d\n  lr: 0.2\n")
    assert read_yaml(path)["b"] == {"lr": 0.2, "seed": 3}


def test_each_partition_and_aggregator_key_is_read_by_the_functions_that_name_it():
    """What cfl/ignored_keys.py takes as read: the built-in functions' own parameters, each key by one at least."""
    from cfl.data.partition import PARTITIONERS
    from cfl.ignored_keys import parameter_names
    from cfl.ops.aggregate import AGGREGATORS

    keys = {"shards_per_client", "alpha", "beta", "min_samples", "classes_per_client", "overlap", "tau"}
    reads = {n: parameter_names(f) & keys for registry in (PARTITIONERS, AGGREGATORS) for n, f in registry.items()}
    assert reads == {"iid": set(), "shards": {"shards_per_client"}, "dirichlet": {"alpha", "min_samples"},
                     "quantity": {"beta", "min_samples"}, "classes": {"classes_per_client", "overlap"},
                     "mean": set(), "gma": {"tau"}}


def test_a_key_that_has_no_effect_is_accepted_at_its_default_as_a_resolved_config_holds_it():
    cfg = from_dict({"partition": {"name": "iid", "alpha": 0.5}, "aggregator": {"tau": 0.4}, "ray_workers": 2})
    assert from_dict(cfg.to_dict()) == cfg  # a run's config.yaml: every key, at its default where unread
    with pytest.raises(ConfigError, match="'partition.alpha: 0.6' has no effect"):
        from_dict({"partition": {"name": "iid", "alpha": 0.6}})
    wandb = {"mode": "disabled", "log_artifacts": False, "log_checkpoint": True}  # W&B off: its keys are kept
    assert from_dict({"wandb": wandb}).wandb.log_checkpoint


def test_each_stream_declares_the_optional_fields_its_builder_reads():
    """``StreamEntry.reads`` is what refuses ``stream.seed`` / ``stream.download`` a builder ignores: it must
    name exactly the request fields the builder's code reads (``req.<field>``)."""
    import inspect

    from cfl.data.stream_registry import OPTIONAL_FIELDS, STREAMS

    built_in = {name: entry for name, entry in STREAMS.items() if entry.build.__module__.startswith("cfl.data.")}
    assert built_in and all(entry.reads is not None for entry in built_in.values())
    for name, entry in built_in.items():
        source = inspect.getsource(entry.build)
        assert {f for f in OPTIONAL_FIELDS if f"req.{f}" in source} == entry.reads, name
