"""Every bad input to ``cfl run`` exits with code 2 and a message naming the key, before any data loads."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

import cfl.app.single_run
from cfl.app.cli import main
from cfl.config.keys import dump_yaml
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint
from tests.conftest import make_stream, tiny_config

VALID = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 6, "clients_per_round": 3,
         "rounds_per_task": 2, "lr": 0.05, "method": {"name": "fedavg"}, "wandb": {"mode": "disabled"}}

# (case, argv with {placeholders} -- literal braces doubled --, words the message must contain)
CASES = [
    ("unknown key", ["{cfg}", "--set", "learning_rate=0.1"], ["'learning_rate'", "allowed keys"]),
    ("unknown nested key", ["{cfg}", "--set", "stream.tasks=3"], ["'stream.tasks'", "num_tasks"]),
    ("unknown key in the file", ["{typo}"], ["'num_client'", "num_clients"]),
    ("unknown method parameter", ["{cfg}", "--set", "method.mu=0.1"], ["'method.mu'"]),
    ("wrong type: int", ["{cfg}", "--set", "num_clients=ten"], ["'num_clients'", "integer"]),
    ("wrong type: float", ["{cfg}", "--set", "lr=fast"], ["'lr'", "number"]),
    ("wrong type: bool", ["{cfg}", "--set", "stream.download=maybe"], ["'stream.download'", "true or false"]),
    # keep_client_states
    ("wrong type: keep_client_states", ["{cfg}", "--set", "keep_client_states=maybe"],
     ["'keep_client_states'", "true or false"]),
    ("wrong type: list", ["{cfg}", "--set", "target_accuracies=50"], ["'target_accuracies'", "list"]),
    ("wrong type: section", ["{cfg}", "--set", "partition=iid"], ["'partition'", "mapping"]),
    ("wrong type: int given a float", ["{cfg}", "--set", "rounds_per_task=2.5"], ["'rounds_per_task'"]),
    ("out of range: min", ["{cfg}", "--set", "num_clients=0"], ["'num_clients'", ">= 1"]),
    ("out of range: gt", ["{cfg}", "--set", "lr=0"], ["'lr'", "> 0"]),
    ("out of range: max", ["{cfg}", "--set", "momentum=1.5"], ["'momentum'", "<= 0.999"]),
    ("out of range: negative seed", ["{cfg}", "--set", "seed=-1"], ["'seed'", ">= 0"]),
    ("out of range: gma tau", ["{cfg}", "--set", "aggregator.tau=2"], ["'aggregator.tau'", "<= 1.0"]),
    ("out of range: list item", ["{cfg}", "--set", "target_accuracies=[50, 101]"], ["'target_accuracies'"]),
    ("out of range: checkpoint_every", ["{cfg}", "--set", "checkpoint_every=-1"], ["'checkpoint_every'"]),
    ("out of range: method parameter", ["{cfg}", "--set", "method={{name: fedprox, mu: -1}}"], ["'method.mu'"]),
    # a label the run's figures (matplotlib's mathtext) or a LaTeX table cell cannot take
    ("label: broken mathtext", ["{cfg}", "--set", "label='$\\sqrt{{2$'"], ["'label'", "mathtext", "matplotlib"]),
    ("label: a line break", ["{cfg}", "--set", "label=\"EWC\\n\\nlam\""], ["'label'", "line break"]),
    # every built-in method parameter has an upper bound (cfl/methods/bounds.py)
    ("out of range: method parameter's upper bound", ["{cfg}", "--set", "method={{name: gem, margin: 1e300}}"],
     ["'method.margin'", "<= 10.0"]),
    ("bad choice: loss", ["{cfg}", "--set", "loss=mse"], ["'loss: mse'", "ce, tce"]),
    ("bad choice: on_nonfinite", ["{cfg}", "--set", "on_nonfinite=ignore"], ["'on_nonfinite'", "skip_client"]),
    ("bad choice: wandb.mode", ["{cfg}", "--set", "wandb.mode=cloud"], ["'wandb.mode'", "offline"]),
    ("bad choice: scenario", ["{cfg}", "--set", "stream.scenario=domain"], ["stream.scenario", "task, class"]),
    ("bad device", ["{cfg}", "--set", "device=tpu"], ["'device'", "cuda:N"]),
    ("unknown stream", ["{cfg}", "--set", "stream.name=imagenet"], ["stream.name: imagenet", "split-digits"]),
    ("unknown method", ["{cfg}", "--set", "method.name=sgd"], ["method.name: sgd", "fedavg"]),
    ("unknown partitioner", ["{cfg}", "--set", "partition.name=zipf"], ["partition.name: zipf", "dirichlet"]),
    ("unknown model", ["{cfg}", "--set", "model.name=resnet999"], ["model.name: resnet999", "mlp"]),
    ("unknown plugin method", ["{cfg}", "--set", "plugins=[{{name: nope}}]"], ["plugins[0].name: nope"]),
    ("method twice", ["{cfg}", "--set", "plugins=[{{name: fedavg}}]"], ["method + plugins"]),
    ("too many tasks", ["{cfg}", "--set", "stream.num_tasks=99"], ["'stream.num_tasks'", "5 tasks"]),
    ("clients_per_round > num_clients", ["{cfg}", "--set", "clients_per_round=7"],
     ["'clients_per_round' (7)", "'num_clients' (6)"]),
    ("malformed --set: no =", ["{cfg}", "--set", "lr"], ["malformed --set 'lr'"]),
    ("malformed --set: no key", ["{cfg}", "--set", "=0.1"], ["malformed --set '=0.1'"]),
    ("malformed --set: empty part", ["{cfg}", "--set", "stream..name=x"], ["malformed --set 'stream..name=x'"]),
    ("malformed --set: bad YAML value", ["{cfg}", "--set", "lr=[0.1"], ["--set lr", "not valid YAML"]),
    ("malformed --set: not a section", ["{cfg}", "--set", "lr.x=1"], ["--set lr.x", "'lr' is not a section"]),
    ("missing YAML file", ["{tmp}/nope.yaml"], ["nope.yaml", "does not exist"]),
    ("broken YAML file", ["{broken}"], ["broken.yaml", "not valid YAML"]),
    ("YAML file not a mapping", ["{listed}"], ["listed.yaml", "mapping"]),
    ("missing plugin file", ["{cfg}", "--plugin", "{tmp}/nope.py"], ["nope.py", "does not exist"]),
    ("plugin path is a directory", ["{cfg}", "--plugin", "{tmp}"], ["plugin file '{tmp}' is a directory",
                                                                    "name the FILE.py in it"]),
    ("no config at all", [], ["config file", "--resume"]),
    ("cuda without a GPU", ["{cfg}", "--set", "device=cuda:7"], ["device: cuda:7"]),
    ("existing run dir", ["{cfg}", "--out", "{run}"], ["{run}", "--overwrite", "cfl run --resume {run}"]),
    ("resume: no such dir", ["--resume", "{tmp}/nowhere"], ["--resume", "nowhere", "no such run directory"]),
    ("resume: not a run dir", ["--resume", "{tmp}"], ["--resume", "no config.yaml"]),
    ("resume: no checkpoint", ["--resume", "{fresh}"], ["--resume", "no checkpoint.pt"]),
    ("resume: damaged checkpoint", ["--resume", "{damaged}"], ["checkpoint.pt is unreadable"]),
    ("resume: edited config.yaml", ["--resume", "{edited}"], ["no longer matches", "lr: 0.05 in the checkpoint"]),
    ("resume: --set that changes results", ["--resume", "{run}", "--set", "lr=0.1"], ["--set lr", "--resume"]),
    ("resume: malformed --set", ["--resume", "{run}", "--set", "threads"], ["malformed --set 'threads'"]),
    ("resume: bad value of an allowed key", ["--resume", "{run}", "--set", "threads=-2"], ["'threads'", ">= 0"]),
    ("resume: plugin not given again", ["--resume", "{plugged}"], ["plugins[0].name: gone", "--plugin"]),
    ("resume with a config file", ["{cfg}", "--resume", "{run}"], ["--resume", "a config file"]),
    ("resume with --out", ["--resume", "{run}", "--out", "{tmp}/x"], ["--resume", "--out"]),
    ("resume with --overwrite", ["--resume", "{run}", "--overwrite"], ["--resume", "--overwrite"]),
    ("non-finite: NaN", ["{cfg}", "--set", "lr=.nan"], ["'lr'", "finite number"]),
    ("non-finite: inf", ["{cfg}", "--set", "lr=.inf"], ["'lr'", "finite number"]),
    ("non-finite: 1e400 overflows", ["{cfg}", "--set", "lr=1e400"], ["'lr'", "finite number"]),
    ("non-finite: momentum", ["{cfg}", "--set", "momentum=.nan"], ["'momentum'", "finite number"]),
    ("non-finite: gma tau", ["{cfg}", "--set", "aggregator.tau=.nan"], ["'aggregator.tau'", "finite number"]),
    ("non-finite: dirichlet alpha", ["{cfg}", "--set", "partition.alpha=.nan"], ["'partition.alpha'", "finite"]),
    ("non-finite: list item", ["{cfg}", "--set", "target_accuracies=[.nan]"], ["'target_accuracies[0]'", "finite"]),
    ("non-finite: method parameter", ["{cfg}", "--set", "method={{name: fedprox, mu: .nan}}"],
     ["'method.mu'", "finite"]),
    ("non-finite: plugin parameter", ["{cfg}", "--set", "plugins=[{{name: fedprox, mu: -.inf}}]"],
     ["'plugins[0].mu'", "finite"]),
    ("model does not fit the stream", ["{cfg}", "--set", "model.name=alexnet"],
     ["model.name: alexnet", "split-digits", "(1, 8, 8)", "digits-mlp"]),
    ("method vs config: gpse_clients > num_clients", ["{cfg}", "--set", "method={{name: fot, gpse_clients: 1000}}"],
     ["'method.gpse_clients' (1000)", "'num_clients' (6)"]),
    ("seed beyond 64 bits", ["{cfg}", "--set", "seed=18446744073709551616"], ["'seed'", "2**63"]),
    ("seed beyond numpy's 32 bits", ["{cfg}", "--set", "seed=4294967296"], ["'seed'", "<= 4294967295"]),
    ("stream seed beyond 32 bits", ["{cfg}", "--set", "stream.seed=4294967296"], ["'stream.seed'", "<= 4294967295"]),
    ("method parameter beyond 64 bits", ["{cfg}", "--set", "method={{name: fot, chunk: 100000000000000000000}}"],
     ["'method.chunk'", "2**63"]),
    ("threads beyond the machine", ["{cfg}", "--set", "threads=100000"], ["'threads' is 100000", "CPUs", "at most"]),
    ("batch_size too large", ["{cfg}", "--set", "batch_size=1000000000000"], ["'batch_size'", "<= 1048576"]),
    ("shards: a client gets no data", ["{cfg}", "--set", "partition={{name: shards, shards_per_client: 5}}", "--set",
                                      "num_clients=200", "--out", "{elsewhere}/shards"],
     ["partition.shards_per_client=5", "num_clients=200", "no data"]),
    ("binary config file", ["{binary}"], ["binary.yaml", "not UTF-8"]),
    ("plugin with a syntax error", ["{cfg}", "--plugin", "{tmp}/bad_plugin.py"], ["bad_plugin.py", "at line 2"]),
    ("duplicate key in the file", ["{dup}"], ["key 'lr' is given twice", "lines 1 and 3"]),
    ("duplicate key in a --set mapping", ["{cfg}", "--set", "method={{name: fedprox, mu: 1, mu: 2}}"],
     ["--set method", "key 'mu' is given twice"]),
    ("parameters of a method without any", ["{cfg}", "--set", "method.lam=3"],
     ["'method.lam'", "method 'fedavg' takes no parameters"]),
    ("client forgetting on more clients than a round has", ["{cfg}", "--set", "client_forgetting_clients=4"],
     ["'client_forgetting_clients' (4)", "'clients_per_round' (3)"]),
    ("resume: a W&B run id that is a path", ["--resume", "{badid}"],
     ["the W&B run id in checkpoint.pt '../../elsewhere' is not a W&B id", "--overwrite"]),
    ("--trust-callables outside a W&B sweep", ["{cfg}", "--trust-callables"],
     ["--trust-callables is read only under a W&B sweep"]),
    # ---- a key the chosen component does not read, set away from its default ----
    ("ignored key: dirichlet alpha with iid", ["{cfg}", "--set", "partition.alpha=0.3"],
     ["'partition.alpha: 0.3' has no effect with 'partition.name: iid'", "only dirichlet reads it",
      "remove partition.alpha, or set partition.name: dirichlet"]),
    ("ignored key: shards_per_client with dirichlet", ["{cfg}", "--set", "partition={{name: dirichlet, "
                                                                       "shards_per_client: 3}}"],
     ["'partition.shards_per_client: 3'", "'partition.name: dirichlet'", "only shards reads it"]),
    ("ignored key: min_samples with shards", ["{cfg}", "--set", "partition={{name: shards, min_samples: 4}}"],
     ["'partition.min_samples: 4'", "'partition.name: shards'", "only dirichlet, quantity read it"]),
    ("ignored key: gma tau with mean", ["{cfg}", "--set", "aggregator.tau=0.2"],
     ["'aggregator.tau: 0.2' has no effect with 'aggregator.name: mean'", "only gma reads it"]),
    ("ignored key: ray_workers on the local backend", ["{cfg}", "--set", "ray_workers=4"],
     ["'ray_workers: 4' has no effect with 'backend: local'", "read only with backend: ray"]),
    ("ignored key: client_block of sequential clients", ["{cfg}", "--set", "client_execution=sequential", "--set",
                                                         "client_block=2"],
     ["'client_block: 2' has no effect with 'client_execution: sequential'", "set client_execution: batched"]),
    ("ignored key: server_lr with an adaptive server", ["{cfg}", "--set", "method.name=fedadam", "--set",
                                                        "server_lr=0.5"],
     ["'server_lr: 0.5' has no effect with 'method.name: fedadam'", "the method's own server_lr",
      "or set it to its default (server_lr: 1.0, --set server_lr=1.0)"]),
    ("ignored key: server_lr with an adaptive plugin", ["{cfg}", "--set", "plugins=[{{name: fedyogi}}]", "--set",
                                                        "server_lr=0.5"],
     ["'server_lr: 0.5' has no effect with 'plugins[0].name: fedyogi'"]),
    ("ignored key: log_checkpoint without artifacts",
     ["{cfg}", "--set", "wandb={{mode: offline, log_artifacts: false, log_checkpoint: true}}"],
     ["'wandb.log_checkpoint: true' has no effect with 'wandb.log_artifacts: false'", "no artifact is logged"]),
    ("ignored key: stream.seed of a stream without permutations", ["{cfg}", "--set", "stream.seed=3"],
     ["'stream.seed: 3' has no effect with 'stream.name: split-digits'", "stream 'split-digits' does not read it",
      "permuted-digits", "remove stream.seed"]),
    ("ignored key: stream.download of a bundled stream", ["{cfg}", "--set", "stream.download=true"],
     ["'stream.download: true' has no effect with 'stream.name: split-digits'", "remove stream.download"]),
    # ---- NaN and infinities anywhere in a config ----
    ("non-finite: stream.args, nested", ["{cfg}", "--set", "stream={{name: avalanche, benchmark: nowhere.make, "
                                                           "args: {{noise: [1, .nan]}}}}"],
     ["'stream.args.noise[1]' is nan", "not a finite number"]),
    ("non-finite: stream.args by --set", ["{cfg}", "--set", "stream.args.noise=.inf"],
     ["'stream.args.noise' is inf", "not a finite number"]),
    # ---- YAML aliases expanded beyond the limit ----
    ("YAML alias bomb in a --set value", ["{cfg}", "--set", "stream.args=" + "[&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "
                                          + ", ".join(f"&{b} [{', '.join([f'*{a}'] * 10)}]" for a, b in
                                                      zip("abcdefgh", "bcdefghi", strict=True)) + "]"],
     ["--set stream.args", "more than 100,000 values", "aliases"]),
    # ---- smaller messages ----
    ("config file is a directory", ["{tmp}"], ["config file '{tmp}' is a directory", "cfl run --resume"]),
    # -- local optimisers --
    ("optimizer: unknown name", ["{cfg}", "--set", "optimizer.name=rmsprop"], ["'optimizer.name'", "adamw"]),
    ("optimizer: a beta of 1", ["{cfg}", "--set", "optimizer={{name: adam, betas: [0.9, 1.0]}}"],
     ["'optimizer.betas'", "two numbers in [0, 1)"]),
    ("optimizer: one beta", ["{cfg}", "--set", "optimizer={{name: adam, betas: [0.9]}}"], ["'optimizer.betas'"]),
    ("optimizer: zero eps", ["{cfg}", "--set", "optimizer={{name: adam, eps: 0}}"], ["'optimizer.eps'", "> 0"]),
    ("optimizer: state kept with plain SGD", ["{cfg}", "--set", "optimizer.state=kept"],
     ["'optimizer.state: kept' with plain SGD (momentum 0): it has no state to keep", "optimizer.state: fresh"]),
    ("optimizer: adamw decay with a gradient projection", ["{cfg}", "--set", "optimizer.name=adamw", "--set",
                                                           "weight_decay=0.01", "--set", "method.name=gpm"],
     ["'optimizer.name: adamw'", "method gpm projects", "use optimizer.name: adam"]),
    ("ignored key: momentum with adam", ["{cfg}", "--set", "optimizer.name=adam", "--set", "momentum=0.9"],
     ["'momentum: 0.9' has no effect with 'optimizer.name: adam'", "optimizer.betas"]),
    ("ignored key: betas with sgd", ["{cfg}", "--set", "optimizer.betas=[0.8, 0.99]"],
     ["'optimizer.betas: [0.8, 0.99]' has no effect with 'optimizer.name: sgd'", "set optimizer.name: adam"]),
    # -- FedLwF / FLwF-2T --
    ("fedlwf: negative lambda", ["{cfg}", "--set", "method={{name: fedlwf, lam: -1}}"], ["'method.lam'", ">= 0"]),
    ("fedlwf: zero temperature", ["{cfg}", "--set", "method={{name: fedlwf, temperature: 0}}"],
     ["'method.temperature'", "> 0"]),
    ("flwf2t: non-finite temperature", ["{cfg}", "--set", "method={{name: flwf2t, temperature: .inf}}"],
     ["'method.temperature'", "finite"]),
    ("flwf2t: zero cross-entropy weight", ["{cfg}", "--set", "method={{name: flwf2t, alpha: 0}}"],
     ["'method.alpha'", "> 0"]),
    ("flwf2t: alpha + beta > 1", ["{cfg}", "--set", "method={{name: flwf2t, alpha: 0.8, beta: 0.3}}"],
     ["'method.alpha' + 'method.beta'", "exceeds 1"]),
    # -- RGO+FL --
    ("rgo: fel (the paper's feature encoding layer) is not implemented", ["{cfg}", "--set",
                                                                         "method={{name: rgo, fel: true}}"],
     ["'method.fel: true'", "use method.fel: false"]),
    ("rgo: alpha of 0", ["{cfg}", "--set", "method={{name: rgo, alpha: 0}}"], ["'method.alpha'", "> 0"]),
    ("rgo: unknown gram normalisation", ["{cfg}", "--set", "method={{name: rgo, gram: max}}"],
     ["'method.gram' must be one of ['sum', 'mean']", "got 'max'"]),
    # -- clients joining at each task (GLFC's protocol) --
    ("clients_join_per_task: negative", ["{cfg}", "--set", "clients_join_per_task=-1"],
     ["'clients_join_per_task'", ">= 0"]),
    ("clients_join_per_task: first task below clients_per_round", ["{cfg}", "--set", "clients_join_per_task=4"],
     ["'clients_join_per_task: 4' over 2 tasks", "= 2 clients in the first task", "clients_per_round=3",
      "raise num_clients to at least 7"]),
    # FedWeIT and its own networks
    ("fedweit with another model", ["{cfg}", "--set", "method.name=fedweit", "--set", "model.name=digits-mlp"],
     ["method fedweit trains its own networks only (fedweit-mlp, fedweit-lenet)", "set model.name: fedweit-mlp"]),
    ("fedweit's network with another method", ["{cfg}", "--set", "model.name=fedweit-mlp"],
     ["model fedweit-mlp is method fedweit's own network", "set method.name: fedweit"]),
    ("fedweit: class-incremental", ["{cfg}", "--set", "method.name=fedweit", "--set", "stream.scenario=class"],
     ["method fedweit is task-incremental", "set stream.scenario: task"]),
    ("fedweit: weight_decay", ["{cfg}", "--set", "method.name=fedweit", "--set", "weight_decay=0.1"],
     ["method fedweit decays its own parts", "set weight_decay: 0"]),
    ("fedweit: an aggregator other than the mean", ["{cfg}", "--set", "method.name=fedweit", "--set",
                                                    "aggregator.name=gma"],
     ["method fedweit aggregates with its own client_upload/server_aggregate", "set aggregator.name: mean"]),
    ("fedweit: client forgetting", ["{cfg}", "--set", "method.name=fedweit", "--set", "client_forgetting_clients=2"],
     ["method fedweit keeps parameters per client", "set client_forgetting_clients: 0"]),
    # -- BatchNorm running statistics through federated training --
    ("model.buffers: unknown setting", ["{cfg}", "--set", "model.buffers=median"],
     ["'model.buffers' must be one of ['averaged', 'local'], got 'median'"]),
    ("model.buffers: local on a model without running statistics", ["{cfg}", "--set", "model.buffers=local"],
     ["'model.buffers: local' has no effect with 'model.name: digits-mlp'", "keeps no BatchNorm running statistics",
      "resnet18-reduced-running-bn"]),
    # -- TARGET --
    ("target on a model without running statistics", ["{cfg}", "--set", "method.name=target", "--set",
                                                      "stream.scenario=class", "--set", "model.name=mlp"],
     ["method target matches its synthetic images to the model's BatchNorm running statistics",
      "model mlp keeps none", "set model.name: resnet18-reduced-running-bn"]),
    ("target: task-incremental", ["{cfg}", "--set", "method.name=target", "--set", "stream.scenario=task"],
     ["method target is class-incremental only", "set stream.scenario: class"]),
    # -- MFCL --
    ("mfcl: task-incremental", ["{cfg}", "--set", "method.name=mfcl", "--set", "stream.name=split-fmnist", "--set",
                                "stream.scenario=task"],
     ["method mfcl is class-incremental", "the run's scenario is task", "set stream.scenario: class"]),
    ("mfcl: a stream whose default scenario is not class-incremental", ["{cfg}", "--set", "method.name=mfcl", "--set",
                                                                        "stream.name=split-fmnist"],
     ["method mfcl is class-incremental", "set stream.scenario: class"]),
    ("mfcl: a model without running statistics", ["{cfg}", "--set", "method.name=mfcl", "--set",
                                                  "stream.name=split-fmnist", "--set", "stream.scenario=class",
                                                  "--set", "model.name=mlp"],
     ["method mfcl matches its synthetic images to the model's BatchNorm running statistics", "model mlp keeps none",
      "set model.name: resnet18-reduced-running-bn"]),
]
#: refusals that depend on the data (the training set sizes): made after loading it, before any round
AFTER_DATA_LOADS = {"shards: a client gets no data"}


def write_run(path, cfg, edit=None, wandb_run_id=None):
    """A run directory as ``cfl run`` leaves it after its round-0 checkpoint (built without loading data)."""
    path.mkdir()
    (path / "config.yaml").write_text(dump_yaml(cfg if edit is None else edit(cfg)))
    checkpoint.save(path, checkpoint.capture(Runner(cfg, make_stream()).snapshot(), wandb_run_id))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusals")
    (tmp / "ok.yaml").write_text(yaml.safe_dump(VALID))
    (tmp / "typo.yaml").write_text(yaml.safe_dump({**VALID, "num_client": 6}))
    (tmp / "broken.yaml").write_text("lr: [0.1\nseed: 0\n")
    (tmp / "listed.yaml").write_text("- lr\n- seed\n")
    (tmp / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp / "dup.yaml").write_text("lr: 0.05\nseed: 0\nlr: 0.5\n" + yaml.safe_dump({**VALID, "lr": None}))
    (tmp / "bad_plugin.py").write_text("from cfl.methods import register\ndef broken(:\n    pass\n")
    cfg = tiny_config(lr=0.05)
    write_run(tmp / "run", cfg)
    write_run(tmp / "edited", cfg, edit=lambda c: replace(c, lr=0.5))
    write_run(tmp / "damaged", cfg)
    write_run(tmp / "badid", cfg, wandb_run_id="../../elsewhere")
    (tmp / "damaged" / "checkpoint.pt").write_bytes((tmp / "damaged" / "checkpoint.pt").read_bytes()[:100])
    (tmp / "plugged").mkdir()
    (tmp / "plugged" / "config.yaml").write_text(dump_yaml(cfg).replace("plugins: []", "plugins: [{name: gone}]"))
    (tmp / "fresh").mkdir()
    (tmp / "fresh" / "config.yaml").write_text(dump_yaml(cfg))
    names = ("run", "edited", "damaged", "badid", "fresh", "plugged", "broken", "listed", "typo", "binary", "dup")
    return {"tmp": str(tmp), "cfg": str(tmp / "ok.yaml"), "elsewhere": str(tmp_path_factory.mktemp("elsewhere")),
            **{n: str(tmp / n) if (tmp / n).is_dir() else str(tmp / f"{n}.yaml") for n in names}}


def test_the_table_is_large_enough():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("case", "argv", "words"), CASES, ids=[c[0] for c in CASES])
def test_refusal(case, argv, words, files, monkeypatch, capsys):
    if case not in AFTER_DATA_LOADS:
        monkeypatch.setattr(cfl.app.single_run, "load_stream",
                            lambda *_, **__: pytest.fail("data was loaded before the refusal"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = {p: p.stat().st_mtime_ns for p in Path(files["tmp"]).rglob("*")}
    code = main(["run", *[a.format(**files) for a in argv], "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cfl: config error: "), err
    for word in words:
        assert word.format(**files) in err, err
    after = {p: p.stat().st_mtime_ns for p in Path(files["tmp"]).rglob("*")}
    assert after == before  # nothing written, nothing created


# ---- cases that write their own files, run from tmp_path ----
def laughs(leaf: str = "lol") -> str:
    """A 'billion laughs' flow mapping under 1 KB: nine levels of ten aliases each, 10**9 leaves expanded."""
    levels = [f"a: &a [{', '.join([leaf] * 10)}]"]
    levels += [f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
    return "{" + ", ".join(levels) + "}"


NAN_PLUGIN = """from dataclasses import dataclass
from cfl.methods import Method, register

@dataclass(frozen=True)
class NanParams:
    gamma: float = float("nan")

@register
class Nanny(Method):
    name = "nanny"
    about = "a method whose parameter defaults to NaN"
    Hyperparams = NanParams
"""
GRID = "base: ok.yaml\ngrid: {seed: [0, 1]}\n"
REPORTED = ('{{"stream": "s", "partition": "iid", "method": "fedavg", "seed": 0, "acc": {acc}, "fgt": 1, '
            '"config": {{"lr": 0.1}}}}')
#: a finished run's results.json for `cfl report`
RUN = ('{"stream": "split-digits", "partition": "iid", "method": "fedavg", "seed": 0, "acc": 70.0, "fgt": 1.0, '
       '"complete": true, "config": {"seed": 0, "method": {"name": "fedavg"}}}')
# (case, {file: text} written besides ok.yaml, environment, argv ({tmp}: tmp_path), words of the message)
OWN_FILE_CASES = [
    ("non-finite: a plugin method's default", {"nan_plugin.py": NAN_PLUGIN}, {},
     ["run", "ok.yaml", "--plugin", "nan_plugin.py", "--set", "method.name=nanny"],
     ["'method.gamma' is nan (the default in the Hyperparams of method 'nanny'", "or set method.gamma", "finite"]),
    ("YAML alias bomb in a config file", {"bomb.yaml": f"stream: {{name: avalanche, args: {laughs()}}}\n"}, {},
     ["run", "bomb.yaml"], ["config file 'bomb.yaml'", "more than 100,000 values", "aliases"]),
    ("YAML alias bomb in a sweep file", {"s.yaml": f"base: ok.yaml\nset: {{stream.args: {laughs()}}}\n"}, {},
     ["sweep", "s.yaml"], ["'s.yaml'", "more than 100,000 values"]),
    ("YAML alias bomb in a resumed config.yaml", {"old/config.yaml": f"lr: 0.1\nstream: {{args: {laughs()}}}\n"}, {},
     ["run", "--resume", "old"], ["'old/config.yaml'", "more than 100,000 values"]),
    ("YAML alias bomb in a W&B sweep parameter file", {"params.yaml": f"stream.args: {{value: {laughs()}}}\n"},
     {"WANDB_SWEEP_PARAM_PATH": "{tmp}/params.yaml"}, ["run", "ok.yaml"],
     ["W&B sweep parameter file '{tmp}/params.yaml'", "more than 100,000 values"]),
    ("recursive YAML alias", {"loop.yaml": "stream: {name: avalanche, args: &r {again: *r}}\n"}, {},
     ["run", "loop.yaml"], ["config file 'loop.yaml'", "holds the alias itself"]),
    ("data_root is a file", {}, {}, ["run", "ok.yaml", "--out", "out", "--set", "data_root=ok.yaml"],
     ["the data root ok.yaml (from config key 'data_root') is a file, not a directory", "--set data_root=DIR"]),
    ("sweep: out is a file", {"s.yaml": GRID + "out: afile\n", "afile": "x"}, {}, ["sweep", "s.yaml"],
     ["sweep 's.yaml'", "folder afile is a file", "choose another 'out'"]),
    ("sweep: out lies under a file", {"s.yaml": GRID, "afile": "x"}, {}, ["sweep", "s.yaml", "--out", "afile/runs"],
     ["sweep 's.yaml'", "afile/runs lies under afile, which is a file"]),
    ("sweep: two grid values give one directory name", {"s.yaml": "base: ok.yaml\ngrid: {wandb.name: [x y, x_y]}\n"},
     {}, ["sweep", "s.yaml"], ["the grid values wandb.name: 'x y' and 'x_y'", "run directory name 'wandb=x_y'"]),
    ("sweep: a key its grid leaves unread", {"s.yaml": "base: ok.yaml\nset: {partition.alpha: 0.3}\n"
                                             "grid: {partition.name: [iid, dirichlet]}\n"}, {}, ["sweep", "s.yaml"],
     ["sweep combination partition=iid: 'partition.alpha: 0.3' has no effect with 'partition.name: iid'",
      "variant: [{{label: a, partition.name: iid}}, {{label: b, partition.name: dirichlet, partition.alpha: 0.3}}]"]),
    # ---- cfl report ----
    ("report: one config and seed with different results", {"a/results.json": REPORTED.format(acc=70),
                                                            "b/results.json": REPORTED.format(acc=71)}, {},
     ["report", "a", "b"], ["seed 0 has 2 runs of the same config whose results differ (acc)", "a, b"]),
    ("report: an unknown column", {"a/results.json": REPORTED.format(acc=70)}, {},
     ["report", "a", "--columns", "method,acc,top5"], ["--columns: unknown column(s) 'top5'",
                                                         "fwt, client_acc, client_fgt, targets"]),
    ("report: a caption outside LaTeX", {"a/results.json": REPORTED.format(acc=70)}, {},
     ["report", "a", "--caption", "Results."], ["--caption is read only with --format latex (this is --format md)"]),
    ("report: --order names no row", {"a/results.json": REPORTED.format(acc=70)}, {},
     ["report", "a", "--order", "fedavg,fedprx"], ["--order names 'fedprx', which no row has", "(fedavg)"]),
    # ---- figure options of `cfl report --plots`, refused before any figure is written ----
    ("report: an unknown group in the style", {"r/results.json": RUN, "st.yaml": "groups: [{group: fedprox}]\n"}, {},
     ["report", "r", "--plots", "figs", "--plot-style", "st.yaml"],
     ["figure style: no group 'fedprox' among the runs", "the groups are 'fedavg'"]),
    ("report: an unknown key in the style", {"r/results.json": RUN, "st.yaml": "ylim: [0, 100]\n"}, {},
     ["report", "r", "--plots", "figs", "--plot-style", "st.yaml"], ["unknown key(s) ['ylim']", "y_range"]),
    ("report: a colour matplotlib lacks", {"r/results.json": RUN, "st.yaml": "groups: [{group: fedavg, color: "
                                           "blurple}]\n"}, {}, ["report", "r", "--plots", "figs", "--plot-style",
                                                                "st.yaml"], ["'blurple' (group 'fedavg')", "#rrggbb"]),
    ("report: a y range upside down", {"r/results.json": RUN}, {}, ["report", "r", "--plots", "figs", "--y-range",
                                                                    "100", "50"], ["--y-range", "low < high"]),
    ("report: an unknown figure format", {"r/results.json": RUN}, {},
     ["report", "r", "--plots", "figs", "--plot-format", "eps"], ["unknown figure format(s) ['eps']", "pdf, svg"]),
    ("report: figure options without --plots", {"r/results.json": RUN}, {}, ["report", "r", "--y-range", "full"],
     ["shape the figures of --plots DIR", "add --plots DIR"]),
    ("report: --facet without --plots", {"r/results.json": RUN}, {}, ["report", "r", "--facet", "none"],
     ["--facet and --title shape the figures of --plots DIR", "add --plots DIR"]),
    ("report: a reference no row has", {"r/results.json": RUN}, {}, ["report", "r", "--reference", "nosuch"],
     ["--reference 'nosuch' matches no row", "name a method"]),
    ("report: --layout without --format latex", {"r/results.json": RUN}, {},
     ["report", "r", "--layout", "methods-x-settings"], ["--layout is read only with --format latex"]),
    ("report: no such style file", {"r/results.json": RUN}, {},
     ["report", "r", "--plots", "figs", "--plot-style", "nope.yaml"], ["--plot-style nope.yaml: no such file"]),
    # ---- a grid of methods x a method parameter points to the variant entry ----
    ("sweep: methods crossed with a method parameter", {"s.yaml": "base: ok.yaml\ngrid: {method.name: [fedavg, ewc], "
                                                                  "method.lam: [10, 100]}\n"}, {}, ["sweep", "s.yaml"],
     ["unknown config key 'method.lam'", "so method.lam reaches every method of the grid", "'variant' entry",
      "docs/scaling.md, 'Method-by-parameter sweeps'"]),
]


@pytest.mark.parametrize(("written", "env", "argv", "words"), [c[1:] for c in OWN_FILE_CASES],
                         ids=[c[0] for c in OWN_FILE_CASES])
def test_refusal_with_own_files(written, env, argv, words, tmp_path, monkeypatch, capsys):
    from cfl import plugin_files as plugins
    from cfl.methods import METHODS

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plugins, "LOADED", {})  # the plugin file is imported here, its method dropped after
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(VALID))
    for name, text in written.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with METHODS.preserved():
        code = main([*[a.format(tmp=tmp_path) for a in argv], "--quiet"] if argv[0] == "run" else argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("cfl: config error: "), err
    for word in words:
        assert word.format(tmp=tmp_path) in err, err
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before  # nothing written, no run started


def test_a_run_whose_config_sets_a_key_without_effect_still_resumes_and_says_so(tmp_path, capsys):
    """An older cfl accepted partition.alpha with iid: its half-done run resumes (the key changes nothing)."""
    from cfl.ignored_keys import tolerated

    with tolerated():
        cfg = tiny_config(partition={"name": "iid", "alpha": 0.3}, rounds_per_task=1, threads=1,
                          stream={"name": "split-digits", "num_tasks": 1})
        cfl.app.single_run.execute(cfg, tmp_path / "old", quiet=True)
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "old"), "--quiet"]) == 0
    assert "cfl: warning: 'partition.alpha: 0.3' has no effect with 'partition.name: iid'" in capsys.readouterr().err
