"""One run, end to end: checks, data, the round loop, and every output file (the Python API's
``cfl.app.single_run`` is :func:`cfl.app.api.run`, built on :func:`execute`)."""

from __future__ import annotations

import errno
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cfl.config.keys import Config, ConfigError, dump_yaml
from cfl.config.yaml_files import parse_overrides, read_yaml, set_dotted
from cfl.data.load import load_stream
from cfl.engine.rounds.drop_states import drop_client_states
from cfl.engine.rounds.preflight import dry_run_hooks
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.server import NonFiniteError
from cfl.engine.rounds.stop import RunStopped, StopRequest, signal_exit_code
from cfl.engine.stores import checkpoint, rundir
from cfl.engine.stores.lock import LockLost, RunLock, locked
from cfl.engine.stores.path_limits import check_path_length
from cfl.engine.stores.state_codec import RecordDamaged
from cfl.ignored_keys import tolerated
from cfl.methods.hook_guard import HookError
from cfl.metrics.results import build_results
from cfl.plugin_files import resume_command
from cfl.pretrained.features import backbone_results, with_backbone
from cfl.records.run_dir import RESUME_SAFE_KEYS, is_resume_safe
from cfl.report.files import atomic_write_bytes, atomic_write_json, check_searchable, check_writable
from cfl.report.jsonl import MetricsWriter, keep_lines_up_to
from cfl.report.labels import display_label
from cfl.report.progress import ProgressBars
from cfl.report.wandb_log import WandbLogger
from cfl.report.wandb_sweep import RunSource
from cfl.task_numbering import task_name
from cfl.validation import from_dict

# also any other stop mid-run with the last checkpoint kept: a lost lock, a damaged client state, a method's
# hook failing during training
EXIT_NONFINITE = 3
EXIT_DISK_FULL = 4


def default_run_dir(cfg: Config) -> Path:
    method = cfg.method_label
    return Path("runs") / f"{cfg.stream.name}-{method}-{cfg.partition.name}-s{cfg.seed}"


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"'device: {cfg.device}' but no CUDA device is available to torch; use device: cpu")
    return torch.device(cfg.device)


def resume_config(run_dir: Path, overrides: list[str] | list[tuple[str, Any]]) -> Config:
    """The config of the run in ``run_dir`` (its config.yaml), with only result-neutral ``--set`` keys
    (``key=value`` strings, or parsed (key, value) pairs from :func:`cfl.resume`)."""
    pairs = [item if isinstance(item, tuple) else parse_overrides([item])[0] for item in overrides]
    for key, _ in pairs:
        if not is_resume_safe(key):
            raise ConfigError(f"--set {key} cannot be combined with --resume: it would change the results of a run "
                              f"that is half done (a resumed run keeps {run_dir}/config.yaml); allowed with --resume: "
                              f"{', '.join(RESUME_SAFE_KEYS)}. Start a new run with --out instead")
    check_searchable(Path(run_dir), "--resume")
    if not Path(run_dir).is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory")
    if not (Path(run_dir) / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml in it; is it a cfl run directory?")
    data = read_yaml(Path(run_dir) / "config.yaml")
    for key, value in pairs:
        set_dotted(data, key, value)
    try:
        with tolerated():  # a key without effect that an older cfl accepted: said, not refused
            return from_dict(data)
    except ConfigError as err:
        if "unknown method" in str(err):
            raise ConfigError(f"{err} (a run started with --plugin needs the same --plugin to resume)") from None
        if "unknown stream" in str(err):
            raise ConfigError(f"{err} (a run on a stream registered by a plugin needs the same --plugin to resume; "
                              "a run given a Stream object, cfl.run(..., stream=S), resumes with "
                              f"cfl.resume('{run_dir}', stream=S))") from None
        raise


class Checkpointer:
    """``Runner.after_round``: checkpoint at task ends, every ``checkpoint_every`` rounds and when stopping."""

    def __init__(self, runner: Runner, out: Path, stop: StopRequest, wandb_run_id: str | None,
                 attempt: Attempt, lock: RunLock) -> None:
        self.runner, self.out, self.stop, self.wandb_run_id, self.attempt = runner, out, stop, wandb_run_id, attempt
        self.lock = lock

    def save(self) -> None:
        self.lock.check()  # never a checkpoint into a directory another run may have taken over
        self.attempt.saving_round = self.runner.progress.global_round
        checkpoint.save(self.out, checkpoint.capture(self.runner.snapshot(), self.wandb_run_id))
        self.attempt.saved(self.attempt.saving_round)
        for state in self.runner.states:  # the checkpoint is durable: drop client-state files no checkpoint names
            state.clients.committed()

    def __call__(self) -> None:
        prog, every = self.runner.progress, self.runner.cfg.checkpoint_every
        if prog.round_in_task == 0 or (every and prog.global_round % every == 0) or self.stop():
            self.save()


def write_plots(results: dict[str, Any], evaluations: list[dict[str, Any]], rounds_per_task: int,
                out: Path) -> list[Path]:
    """``cfl.report.plots.write_plots``, importing matplotlib (~0.6 s) only once a run has trained. A figure that
    fails is named on stderr and the run goes on (its results.json is written already; exit code 0)."""
    from cfl.report.plots import write_plots as draw

    failed: list[str] = []
    plots = draw(results, evaluations, rounds_per_task, out, failed)
    if failed:
        print(f"cfl: the run is complete and {out}/results.json written, but {', '.join(failed)} could not be "
              "drawn (see the warning above)", file=sys.stderr, flush=True)
    return plots


def execute(cfg: Config, out: Path | None = None, overwrite: bool = False, quiet: bool = False,
            resume: bool = False, source: RunSource | None = None, stop: StopRequest | None = None) -> dict[str, Any]:
    """Run ``cfg`` and write results.json, metrics.jsonl, config.yaml, plots and checkpoints into ``out``.

    ``resume``: continue the run in ``out`` from its checkpoint (``cfg`` from :func:`resume_config`).
    ``source``: the config file and W&B sweep parameters ``cfg`` came from (for the W&B group and config).
    ``stop``: the run's signal flag, for a caller that must know whether a signal came while the run ended
    (``cfl sweep`` then stops after it).
    Everything that can refuse (the directory, its lock, the data, the model) runs before an earlier run's
    outputs are replaced; a run that fails before its round-0 checkpoint leaves nothing behind.
    Raises :class:`RunStopped` after SIGINT/SIGTERM, non-finite values or a full disk, with the last
    checkpoint kept.
    """
    started = time.perf_counter()
    device = resolve_device(cfg)
    out = Path(out) if out is not None else default_run_dir(cfg)
    check_path_length(out)  # before any look at the file system that a long name would turn into OSError 36
    check_writable(out)
    rundir.check_state_dirs(out)
    rundir.check_marker(out)
    saved = _checked_checkpoint(out, cfg) if resume else None
    if not resume:
        rundir.refuse_outputs(out, overwrite)
    created = rundir.make(out)
    attempt = Attempt(out, resume, created)
    stop = stop or StopRequest()
    try:
        with stop.installed(), locked(out) as lock:
            return _execute(cfg, out, device, overwrite, quiet, saved, started, stop, attempt, source, lock)
    except NonFiniteError as err:
        raise RunStopped(f"{err}. Stopped; {attempt.kept()}", EXIT_NONFINITE) from None
    except LockLost as err:  # nothing is cleaned up: the files may be another run's now
        raise RunStopped(f"{err}. Stopped; {attempt.kept(locked_out=True)}", EXIT_NONFINITE) from None
    except RecordDamaged as err:  # read in the middle of the run (a resume checks every record first)
        raise RunStopped(f"client state on disk damaged during the run: {err}. Stopped; {attempt.kept()} "
                         f"(the resume checks every record the checkpoint names)", EXIT_NONFINITE) from None
    except KeyboardInterrupt as err:
        attempt.clean_up()
        code = signal_exit_code(err)
        raise RunStopped(f"stopped at once by {signal.Signals(code - 128).name}; {attempt.kept()}", code) from None
    except OSError as err:
        attempt.clean_up()
        if err.errno != errno.ENOSPC:
            raise
        raise RunStopped(f"disk full (OSError {err.errno}: {err.strerror}) while writing {err.filename or out}. "
                         f"Stopped; {attempt.kept(full=True)}", EXIT_DISK_FULL) from None
    except BaseException:
        attempt.clean_up()
        raise


class Attempt:
    """How far this process got with a run directory: for the stop messages and to undo a run that never
    trained (so that a fixed re-run is not blocked by its config.yaml)."""

    def __init__(self, out: Path, resume: bool, created: Path | None) -> None:
        self.out, self.resume, self.created = out, resume, created
        self.saved_round = -1  # the round of the last checkpoint this process wrote or restored
        self.saving_round = -1  # the round of the checkpoint this process began writing last
        self.saved_file: tuple[int, int] | None = None  # (inode, mtime_ns) of the checkpoint saved_round names
        self.writing = False  # this process has started writing the directory's outputs
        self.marked = False  # this process wrote the run-directory marker

    def saved(self, global_round: int) -> None:
        """The checkpoint after ``global_round`` is on disk (written or restored)."""
        self.saved_round, self.saved_file = global_round, self._checkpoint_file()

    def _checkpoint_file(self) -> tuple[int, int] | None:
        try:
            stat = (self.out / checkpoint.CHECKPOINT).stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns

    def _settle(self) -> None:
        """A signal that stopped the run at once inside a checkpoint save, after its atomic rename: that
        checkpoint is on disk and whole, so it counts (a round-0 one otherwise left a checkpoint that the
        clean-up stripped of its config.yaml, which no resume could use)."""
        if self.saving_round > self.saved_round and self._checkpoint_file() not in (None, self.saved_file):
            self.saved(self.saving_round)

    def kept(self, full: bool = False, locked_out: bool = False) -> str:
        self._settle()
        if self.saved_round < 0:
            return "nothing was trained, so nothing is kept" + ("; free some space and run it again" if full else "")
        valid = (" and still valid (a checkpoint is replaced atomically, so a failed write leaves the previous one)"
                 if full else "")
        action = ("make sure no other cfl run uses the directory, then resume" if locked_out
                  else "free some space, then resume" if full else "resume")
        return (f"the last checkpoint (after round {self.saved_round}) is kept in "
                f"{self.out}/{checkpoint.CHECKPOINT}{valid}; {action} with: {resume_command(self.out)}")

    def clean_up(self) -> None:
        """A new run that failed before its round-0 checkpoint: remove what it wrote."""
        self._settle()
        if self.resume or self.saved_round >= 0:
            return
        if self.writing:
            for name in ("config.yaml", "metrics.jsonl"):
                (self.out / name).unlink(missing_ok=True)
            shutil.rmtree(self.out / rundir.CLIENT_STATES, ignore_errors=True)
        if self.marked:
            (self.out / rundir.MARKER).unlink(missing_ok=True)
        if self.created is not None:
            rundir.remove_if_empty(self.out, self.created)


def _checked_checkpoint(out: Path, cfg: Config) -> dict[str, Any]:
    saved = checkpoint.load(out)
    checkpoint.check_config(saved["config"], cfg, out)
    return saved


def _execute(cfg: Config, out: Path, device: torch.device, overwrite: bool, quiet: bool,
             saved: dict[str, Any] | None, started: float, stop: StopRequest, attempt: Attempt,
             source: RunSource | None, lock: RunLock) -> dict[str, Any]:
    """The run itself, in a locked directory: build everything, replace old outputs, train, write outputs."""
    if saved is None:
        rundir.refuse_outputs(out, overwrite)  # again: another run may have written here before the lock
    else:
        saved = _checked_checkpoint(out, cfg)  # the run may have moved on since the first look
        started -= saved["progress"]["wall_seconds"]
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    stream = with_backbone(cfg, load_stream(**cfg.stream_fields(), device=device), device)  # features, said on stderr
    if saved is not None:
        checkpoint.check_data(saved, stream, cfg)  # before config.yaml is rewritten
    method = cfg.method_label
    bars = ProgressBars(stream.num_tasks, cfg.rounds_per_task, method, enabled=not quiet)
    runner = Runner(cfg, stream, [], device, state_dir=out / rundir.CLIENT_STATES)
    dry_run_hooks(runner)  # a hook that raises or returns wrong shapes is refused before any file is written
    attempt.writing = True
    attempt.marked = rundir.mark(out)  # before any output: a directory cfl made (a resumed older run's too)
    if saved is None:
        rundir.clear_outputs(out)  # --overwrite: only now that data and model are there
    else:
        checkpoint.remove_stale_temp_files(out)
    atomic_write_bytes(out / "config.yaml", dump_yaml(cfg).encode())
    logger = WandbLogger(cfg, out, source, run_id=saved["wandb_run_id"] if saved else None)
    runner.observers = [lock, bars, MetricsWriter(out / "metrics.jsonl"), logger]  # the lock checked first
    saver = Checkpointer(runner, out, stop, logger.run_id, attempt, lock)
    if saved is not None:
        runner.resume(checkpoint.restore(runner.snapshot(), saved))
        attempt.saved(runner.progress.global_round)
        runner.progress.resumed_after_rounds.append(runner.progress.global_round)  # in results.json, and kept
        keep_metrics_lines(out / "metrics.jsonl", runner.progress.global_round, runner.progress.evaluations)
        if not quiet:
            print(f"cfl: resumed {out} from its checkpoint after global round {runner.progress.global_round} "
                  f"({runner.progress.task} of {stream.num_tasks} tasks done)", file=sys.stderr, flush=True)
    else:
        saver.save()  # round 0: a run killed at any later moment can be resumed
    stop.defer()
    runner.after_round, runner.should_stop = saver, stop
    try:
        runner.run()
    except HookError as err:
        raise RunStopped(f"{err}; at {position(runner)}. Stopped; {attempt.kept()} once the hook is fixed",
                         EXIT_NONFINITE) from None
    finally:
        bars.close()
        runner.client_stores.close()
    prog = runner.progress
    if stop() and prog.task < stream.num_tasks:
        where = task_name(prog.task, stream.num_tasks)
        raise RunStopped(f"stopped by {stop.name} after round {prog.global_round} ({where}); checkpoint saved. "
                         f"Resume with: {resume_command(out)}",
                         128 + int(stop.signum))
    results = build_results(runner.snapshot(), time.perf_counter() - started)
    results["display_label"] = display_label(cfg.method_label, results["config"], results["method_info"])
    backbone_results(results, stream, cfg.model.weights_origin)  # flagged in results.json, every row and legend
    results["wandb_run_id"] = logger.run_id
    lock.check()
    atomic_write_json(out / "results.json", results)  # before any figure: a figure that fails never costs results
    plots = write_plots(results, runner.progress.evaluations, cfg.rounds_per_task, out)
    if not cfg.keep_client_states:  # after results.json: a run killed before has complete outputs and its states
        print(drop_client_states(runner, out, logger.run_id, lock), file=sys.stderr, flush=True)
    logger.finish(results, out, plots)  # then W&B, which logs the files as an artifact
    if not quiet:
        print(summary(results, out))
    return results


def position(runner: Runner) -> str:
    """Where the run is: in which round of which task, or at a task's end (0-based task, as in messages)."""
    prog = runner.progress
    if prog.round_in_task < runner.cfg.rounds_per_task:
        return f"{task_name(prog.task)}, round {prog.round_in_task + 1} of the task"
    return f"the end of {task_name(prog.task)}"


def keep_metrics_lines(path: Path, rounds: int, evaluations: list[dict[str, Any]]) -> None:
    """After a resume, metrics.jsonl holds exactly the lines up to the checkpoint (later lines are redone)."""
    atomic_write_bytes(path, keep_lines_up_to(path, rounds, evaluations).encode())


def summary(results: dict[str, Any], out: Path) -> str:
    """The run's last lines: its metrics, then its outputs, the feature cache it read or wrote among them (a file
    outside the run directory, under data_root: results.json's ``backbone.features.cache``)."""
    mb = 1024 * 1024
    cache = (results.get("backbone") or {}).get("features", {}).get("cache")
    return (f"{results['method']} on {results['stream']} ({results['partition']}, seed {results['seed']}): "
            f"ACC {results['acc']:.2f}%  FGT {results['fgt']:.2f}%  BWT {results['bwt']:.2f}%  "
            f"{results['rounds']} rounds, {results['wall_seconds']:.1f}s, "
            f"up {results['upload_bytes'] / mb:.1f} MiB, down {results['download_bytes'] / mb:.1f} MiB\n"
            f"outputs: {out}/ (results.json, metrics.jsonl, config.yaml, acc_matrix.png, accuracy_curve.png, "
            "task_accuracy.png)" + (f"; feature cache: {cache}" if cache else ""))

