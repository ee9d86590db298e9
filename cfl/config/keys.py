"""The run configuration's schema: YAML -> frozen dataclasses of typed, range-checked keys.

Every key is documented here (``cfl config-reference`` prints the table). Names that the registries
hold (stream, model, partitioner, methods and their parameters, aggregator, loss) are checked by
:mod:`cfl.validation`, which builds every config a run, sweep or resume uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import yaml

from cfl.config.model_keys import ModelConfig
from cfl.config.schema import ConfigError, field, to_dict

__all__ = ["Config", "ConfigError", "dump_yaml"]

#: numpy's RandomState (Avalanche's task permutations) takes seeds below 2**32
SEED_MAX = 2**32 - 1
#: above any bundled task's training set (the largest, SVHN's, has 73,257 samples)
BATCH_SIZE_MAX = 2**20


@dataclass(frozen=True)
class StreamConfig:
    name: str = field("split-digits", "stream name (see `cfl list`)")
    num_tasks: Optional[int] = field(None, "use the first N tasks of the stream (null: all)", min=1)
    scenario: str = field("auto", "auto (the stream's default), domain, task or class incremental",
                          choices=("auto", "domain", "task", "class"))
    seed: Optional[int] = field(None, "seed of the task permutations (null: the run seed); below 2**32",
                                 min=0, max=SEED_MAX)
    download: bool = field(False, "download missing data files (needs network)")
    train_per_class: Optional[int] = field(None, "keep a seeded, class-balanced subset of each task's training "
                                           "samples: N of every class (seed: stream.seed, else the run seed; "
                                           "null: all); refused above a class's count or where it keeps all "
                                           "(docs/data.md)", min=1)
    test_per_class: Optional[int] = field(None, "the same for each task's test samples (null: all)", min=1)
    benchmark: Optional[str] = field(None, "name: avalanche: dotted path of a callable returning an Avalanche "
                                     "benchmark, e.g. avalanche.benchmarks.classic.SplitMNIST (docs/streams.md)")
    args: Optional[dict[str, Any]] = field(None, "name: avalanche: keyword arguments of that callable, e.g. "
                                           "{n_experiences: 5, seed: 0} (null: none)")


@dataclass(frozen=True)
class PartitionConfig:
    name: str = field("iid", "iid, shards, dirichlet, quantity or classes")
    shards_per_client: int = field(2, "shards: label shards per client", min=1)
    alpha: float = field(0.5, "dirichlet: concentration of the class proportions", gt=0)
    beta: float = field(0.5, "quantity: concentration of the client sizes", gt=0)
    min_samples: int = field(1, "dirichlet/quantity: fewest samples a client may get", min=1)
    classes_per_client: int = field(6, "classes: classes of each task a client draws (GLFC's protocol: 6 of 10)", min=1)
    overlap: bool = field(True, "classes: a client holds every sample of its classes, shared with the clients that "
                          "drew them (GLFC's official code); false: each class's samples split between them")


@dataclass(frozen=True)
class AggregatorConfig:
    name: str = field("mean", "server aggregation of client updates: mean (FedAvg) or gma")
    tau: float = field(0.4, "gma: agreement threshold of the soft mask (0 = plain averaging)",
                       min=0.0, max=1.0)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = field("sgd", "local optimiser: sgd (with the top-level momentum and weight_decay), adam (weight_decay "
                      "as an L2 term in the gradient, as torch.optim.Adam) or adamw (decoupled weight decay, as "
                      "torch.optim.AdamW); see docs/concepts.md", choices=("sgd", "adam", "adamw"))
    betas: list[float] = field([0.9, 0.999], "adam/adamw: decay rates of the first and second moment estimates, "
                               "each in [0, 1)", min=0.0)
    eps: float = field(1e-8, "adam/adamw: added to the root of the second moment", gt=0)
    state: str = field("fresh", "the optimiser's state (momentum buffer, Adam moments and step count): fresh, "
                       "started anew by every client every round, or kept, carried per client from its last round "
                       "(in memory and in the checkpoint: slots x model size per client that trained)",
                       choices=("fresh", "kept"))


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = field("synchronous", "which task each client trains on at each round (see `cfl list`): synchronous "
                      "(every client switches to the stream's next task at once), staggered, paced, per_client_order "
                      "or random; docs/concepts.md, Schedules")
    order: str = field("auto", "each client's order of tasks: stream, permuted (a seeded permutation per client), "
                       "subset (tasks_per_client consecutive tasks of a seeded permutation, overlap shared with the "
                       "previous client); auto: permuted for per_client_order, else stream",
                       choices=("auto", "stream", "permuted", "subset"))
    tasks_per_client: Optional[int] = field(None, "order: subset: tasks each client trains on (null: all)", min=1)
    overlap: int = field(0, "order: subset: tasks a client shares with the previous client", min=0)
    every: int = field(0, "rounds a client spends on each task (0: rounds_per_task); random: the mean", min=0)
    group: int = field(1, "staggered: clients that switch together; paced: the clients running ahead (the "
                       "last ones)", min=1)
    offset: int = field(1, "staggered: rounds between one group's switch and the next group's; paced: "
                        "rounds the leading clients run ahead", min=0)
    spread: Optional[int] = field(None, "random: each client's rounds on a task are drawn from every - spread .. "
                                  "every + spread (null: every // 2)", min=0)
    seed: Optional[int] = field(None, "seed of the schedule's draws (orders, random durations; null: the run "
                                "seed); below 2**32", min=0, max=SEED_MAX)
    join_per_task: int = field(0, "synchronous: clients joining at each task after the first (GLFC's protocol; the "
                               "top-level clients_join_per_task is the same key)", min=0)
    late_clients: int = field(0, "the last N clients join at join_round (each then starts its order)", min=0)
    join_round: int = field(0, "global round (0-based) at which the late clients join", min=0)
    leave_clients: int = field(0, "the first N clients leave the federation at leave_round", min=0)
    leave_round: int = field(0, "global round (0-based) from which the leaving clients take no part", min=0)
    forgetting: str = field("last_finisher", "every schedule but synchronous: the evaluation a task's FGT and the "
                            "schedule's AIA count from: last_finisher, after the round its last holder left it "
                            "(Powder's and Fed-CPrompt's reading), or first_finisher, after the round some client "
                            "first finished it (cfl's earlier reading); docs/concepts.md, Metrics under a schedule",
                            choices=("last_finisher", "first_finisher"))


@dataclass(frozen=True)
class WandbConfig:
    mode: str = field("offline", "offline (default, sync later), online or disabled",
                      choices=("offline", "online", "disabled"))
    project: str = field("cfl", "W&B project")
    entity: Optional[str] = field(None, "W&B entity (team or user)")
    group: Optional[str] = field(None, "W&B group (null: stream/partition/method, the keys that differ from the "
                                 "config file, and a hash of the config without the seed, so that the seeds of "
                                 "one config and only they share a group; see docs/wandb.md)")
    name: Optional[str] = field(None, "W&B run name (null: <stream>-<method>-<partition>[-<keys that differ from the "
                                "config file, as in the group>]-s<seed>; see docs/wandb.md)")
    tags: list[str] = field([], "W&B tags besides the automatic ones (stream, partition, method names)")
    job_type: str = field("train", "W&B job type")
    log_artifacts: bool = field(True, "log results.json, metrics.jsonl, config.yaml and the plots as a W&B "
                                "artifact (type cfl-run)")
    log_checkpoint: bool = field(False, "also put the final checkpoint.pt into that artifact")


@dataclass(frozen=True)
class Config:
    seed: int = field(0, "seed of sampling, partitions, initialisation, data order and dropout; below 2**32 "
                      "(numpy's RandomState draws the Avalanche permutations)", min=0, max=SEED_MAX)
    stream: StreamConfig = field(StreamConfig(), "")
    model: ModelConfig = field(ModelConfig(), "")
    partition: PartitionConfig = field(PartitionConfig(), "")
    num_clients: int = field(10, "number of clients", min=1)
    clients_per_round: int = field(10, "clients sampled (without replacement) each round", min=1)
    clients_join_per_task: int = field(0, "clients joining at each task after the first (GLFC's protocol): "
                                       "num_clients is the total at the last task, the first task has num_clients - "
                                       "clients_join_per_task x (num_tasks - 1), and rounds, task ends and the "
                                       "partition use only the clients that have joined (0: all from the start; "
                                       "docs/methods/glfc.md)", min=0)
    rounds_per_task: int = field(20, "communication rounds per task (a schedule's default time per task)", min=1)
    schedule: ScheduleConfig = field(ScheduleConfig(), "")
    local_epochs: int = field(1, "local epochs per round", min=1)
    batch_size: int = field(32, "local mini-batch size, at most 2**20 (the batched engine sizes its step masks "
                            "by it)", min=1, max=BATCH_SIZE_MAX)
    lr: float = field(0.01, "local learning rate (of optimizer.name)", gt=0)
    lr_groups: dict[str, float] = field({}, "learning rates of their own for some parameters: parameter-name prefix "
                                        "-> lr, e.g. {centers: 2.0e-3, vit.: 1.0e-5}; a parameter whose name starts "
                                        "with a prefix steps at its lr instead of lr (the longest matching prefix "
                                        "wins; every optimiser, AdamW's decoupled decay included); a prefix that "
                                        "matches no parameter of the model is refused; a run with groups takes "
                                        "no stacked path ({}: lr for all; docs/concepts.md)", gt=0)
    momentum: float = field(0.0, "local SGD momentum (optimizer.name: sgd; fresh each round)", min=0.0, max=0.999)
    weight_decay: float = field(0.0, "local weight decay (sgd, adam: an L2 term in the gradient; adamw: decoupled)",
                                min=0.0)
    optimizer: OptimizerConfig = field(OptimizerConfig(), "")
    server_lr: float = field(1.0, "server learning rate eta_g applied to the aggregated update (not read by fedadam "
                             "and fedyogi, which have their own)", gt=0)
    loss: str = field("ce", "client loss: ce or tce (truncated cross-entropy)")
    method: dict[str, Any] = field({"name": "fedavg"}, "method name and its parameters (see docs/methods)")
    plugins: list[dict[str, Any]] = field([], "extra methods combined with `method` (e.g. fedprox)")
    aggregator: AggregatorConfig = field(AggregatorConfig(), "")
    eval_every: int = field(0, "evaluate all seen tasks every N rounds (0: only at task ends)", min=0)
    target_accuracies: list[float] = field([], "per task, the first round (from the task's start) at which that "
                                           "task's own test accuracy reaches each value (%)",
                                           min=0.0, max=100.0)
    client_forgetting_clients: int = field(0, "TCE paper's local client forgetting F_ki/F_k on this many of each "
                                           "round's clients (0: off, else >= 2; one test evaluation each)", min=0)
    client_execution: str = field("batched", "batched (all sampled clients at once) or sequential",
                                  choices=("batched", "sequential"))
    client_block: int = field(0, "batched: clients trained together at a time (0: auto: all of them, but one at a "
                              "time for convolutional nets on CPU, where that keeps the working set in cache; "
                              "see docs/performance.md)", min=0)
    backend: str = field("local", "where clients train: local (this process) or ray (groups of the sampled clients "
                         "on Ray workers; needs the extra ray; see docs/scaling.md)",
                         choices=("local", "ray"))
    ray_workers: int = field(2, "backend: ray: groups (Ray tasks, one CPU each) a round's clients are split into; "
                             "also the CPUs of a local Ray instance", min=1)
    ray_address: Optional[str] = field(None, "backend: ray: address of an existing Ray cluster (null: start a "
                                       "local instance)")
    on_nonfinite: str = field("stop", "a NaN/inf loss or update: stop the run, or skip_client (drop it, warn)",
                              choices=("stop", "skip_client"))
    checkpoint_every: int = field(10, "also checkpoint every N rounds (0: only at task ends; see "
                                  "docs/reliability.md)", min=0)
    client_state_store: str = field("auto", "where the methods' per-client state lives: memory, disk (the run "
                                    "directory's client_states/, read for the clients in play; checkpoints rewrite "
                                    "no unchanged client) or auto (disk when the estimated state of all clients "
                                    "exceeds 256 MiB; see docs/scaling.md)", choices=("auto", "memory", "disk"))
    keep_client_states: bool = field(True, "keep the methods' per-client state once the run has finished (false: "
                                     "drop it after results.json is written: the client_states/ directory and the "
                                     "client states in checkpoint.pt; such a run cannot be resumed, and says so; "
                                     "see docs/scaling.md)")
    device: str = field("cpu", "cpu, cuda or cuda:N", choices=None)
    precision: Union[int, str] = field(32, "32: float32 throughout; bf16-mixed: the matrix products and convolutions "
                                       "of local training in bfloat16 (float32 accumulation) over float32 master "
                                       "weights; losses, steps, aggregation, method algebra and metrics in float32 "
                                       "(docs/performance.md)", choices=(32, "32", "bf16-mixed"))
    threads: int = field(0, "torch CPU threads (0: torch's default; at most 4 per CPU of the machine)", min=0)
    data_root: Optional[str] = field(None, "data directory (null: $CFL_DATA, else the user cache)")
    wandb: WandbConfig = field(WandbConfig(), "")
    label: Optional[str] = field(None, "name of this config in `cfl report` rows, figure legends and W&B group and run "
                                 "names, in place of the method label (null: the method label); one line, its $...$ "
                                 "mathtext must parse (matplotlib draws it); changes no result; a sweep's `variant` "
                                 "entry sets it to its own label")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def clients_joined(self, task: int, num_tasks: int) -> int:
        """The clients that take part in ``task`` (0-based): ids ``0 .. clients_joined - 1``; all ``num_clients``
        unless ``clients_join_per_task`` is set."""
        return self.num_clients - self.clients_join_per_task * (num_tasks - 1 - task)

    @property
    def method_label(self) -> str:
        """The method as reported: method + plugins, plus the aggregator and loss when not the defaults
        (e.g. ``ewc+fedprox``, ``fedavg+gma``, ``fedavg+tce``)."""
        parts = [self.method["name"], *(p["name"] for p in self.plugins)]
        if self.aggregator.name != "mean":
            parts.append(self.aggregator.name)
        if self.loss != "ce":
            parts.append(self.loss)
        return "+".join(parts)

    def stream_fields(self) -> dict[str, Any]:
        """The stream section as :func:`cfl.data.load.load_stream` takes it: the permutation seed and the data
        root as given (``stream.seed`` null: the run seed; ``data_root`` null: resolved by the loader)."""
        stream = self.stream
        return {"name": stream.name, "num_tasks": stream.num_tasks, "scenario": stream.scenario,
                "seed": self.seed if stream.seed is None else stream.seed, "data_root": self.data_root,
                "download": stream.download, "benchmark": stream.benchmark, "args": stream.args,
                "train_per_class": stream.train_per_class, "test_per_class": stream.test_per_class}


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
