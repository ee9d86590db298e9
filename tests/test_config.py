import pytest

from cfl.config import Config, from_dict, load_config, parse_overrides
from cfl.schema import ConfigError

BAD = [
    ({"nope": 1}, "unknown config key 'nope'"),
    ({"stream": {"nmae": "x"}}, "unknown config key 'stream.nmae'"),
    ({"stream": {"name": "imagenet-22k"}}, "unknown stream"),
    ({"stream": {"num_tasks": 0}}, "'stream.num_tasks' must be >= 1"),
    ({"stream": {"num_tasks": 99}}, "has 5 tasks"),
    ({"stream": {"scenario": "domain"}}, "not supported by stream"),
    ({"stream": {"scenario": "sideways"}}, "'stream.scenario' must be one of"),
    ({"stream": "digits"}, "'stream' must be a mapping"),
    ({"model": {"name": "vit"}}, "unknown model"),
    ({"partition": {"name": "random"}}, "unknown partitioner"),
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
    ({"loss": "mse"}, "'loss' must be one of"),
    ({"method": {"name": "magic"}}, "unknown method"),
    ({"method": {}}, "'method.name' is required"),
    ({"method": {"name": "fedavg", "mu": 0.1}}, "unknown config key 'method.mu'"),
    ({"method": {"name": "fedprox", "mu": -1}}, "'method.mu' must be >= 0"),
    ({"plugins": [{"name": "fedprox"}, {"name": "fedprox"}]}, "appears twice"),
    ({"plugins": ["fedprox"]}, "'plugins[0]' must be a mapping"),
    ({"aggregator": {"name": "median"}}, "'aggregator.name' must be one of"),
    ({"aggregator": {"tau": 2}}, "'aggregator.tau' must be <= 1"),
    ({"eval_every": -1}, "'eval_every' must be >= 0"),
    ({"target_accuracies": [50, 120]}, "'target_accuracies' must be <= 100"),
    ({"device": "tpu"}, "'device' must be cpu, cuda or cuda:N"),
    ({"wandb": {"mode": "sometimes"}}, "'wandb.mode' must be one of"),
    ({"client_execution": "parallel"}, "'client_execution' must be one of"),
    ({"on_nonfinite": "ignore"}, "'on_nonfinite' must be one of"),
    ({"seed": -3}, "'seed' must be >= 0"),
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
