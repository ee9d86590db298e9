"""Checkpoints: the whole state of a run in one file, written atomically, restored bit for bit.

The runner derives client sampling, partitions, data order, replay draws and task-end generators from
(seed, task, round, client), so a checkpoint only has to hold what the run has *accumulated*: the global
parameters and BatchNorm running statistics (under ``model.buffers: local`` every client's own too), every
method's server and per-client state (server optimisers live there), the communication ledger, the progress
(position, accuracy matrix, evaluations, timings), the global random generators (torch CPU/CUDA for dropout;
numpy and python for completeness), the W&B run id, the config the run was started with and the fingerprint of
the stream's data (resuming on other data is refused, :mod:`cfl.data.fingerprint`). ``checkpoint.pt`` is replaced
atomically (temp file, fsync, rename, fsync of the directory), so a crash while writing leaves the previous
checkpoint valid. The file carries the SHA-256 of its own content (:func:`content_digest`, under ``sha256``):
a checkpoint changed after cfl wrote it (edited weights, a flipped bit that still unpickles) is refused on
resume, naming the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cfl.config.keys import Config, ScheduleConfig
from cfl.config.schema import ConfigError, to_dict
from cfl.data.fingerprint import differences, fingerprint
from cfl.data.stream import Stream
from cfl.records.run_dir import CHECKPOINT, is_resume_safe
from cfl.records.saved_configs import unread_model_keys, with_added_keys
from cfl.records.snapshot import Progress, RunSnapshot
from cfl.report.files import atomic_write_bytes
from cfl.report.wandb_ids import checked_id
from cfl.validation import resolve_saved_model

FORMAT = 2  # 2: method states as nested dicts (one-client method interface)
DROPPED = "dropped"  # the clients of a method state whose client states the finished run dropped


class CheckpointError(RuntimeError):
    """A method state that cannot be saved safely (only tensors and plain data are allowed)."""


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT


# ---- random generators ----
def rng_state() -> dict[str, Any]:
    """Every global generator: torch CPU (dropout), CUDA when initialised, numpy and python ``random``."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": [torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": [int(version), list(internal), gauss_next],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


# ---- what goes in ----
def check_plain(obj: Any, where: str) -> None:
    """Refuse anything but tensors and plain data, so the file loads with ``torch.load(weights_only=True)``."""
    if obj is None or isinstance(obj, (torch.Tensor, bool, int, float, str)):
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise CheckpointError(f"{where}: key {k!r} is a {type(k).__name__}; use str or int keys")
            check_plain(v, f"{where}[{k!r}]")
        return
    raise CheckpointError(f"{where} is a {type(obj).__name__}; method state must hold only tensors, numbers, "
                          f"strings and lists/dicts of them (convert numpy arrays with torch.as_tensor)")


def capture(run: RunSnapshot, wandb_run_id: str | None, client_states: bool = True) -> dict[str, Any]:
    """Everything needed to continue ``run`` exactly where it is (tensors are shared, not copied); without
    ``client_states`` (``keep_client_states: false``) each method's clients are a :func:`dropped` mark."""
    states = [st.state_dict() if client_states else {"server": st.server, "clients": dropped(len(st.clients))}
              for st in run.states]
    for method, state in zip(run.methods, states, strict=True):
        check_plain(state, f"state of method '{method.name}'")
    progress = dataclasses.asdict(run.progress)
    check_plain(progress, "progress")
    optimizer = {} if run.optimizer_states is None else \
        (run.optimizer_states.state_dict() if client_states else dropped(len(run.optimizer_states)))
    return {
        "format": FORMAT,
        "optimizer_states": optimizer,
        "config": run.cfg.to_dict(),
        "params": run.params,
        "buffers": run.buffers,  # BatchNorm running statistics ({} without any)
        "backbone": run.backbone,  # the shared frozen backbone's tensors a method changed ({} none)
        "buffer_states": {} if run.buffer_states is None else
        (run.buffer_states.state_dict() if client_states else dropped(len(run.buffer_states))),
        "states": states,
        "comm": run.comm.state_dict(),
        "progress": progress,
        "rng": rng_state(),
        "wandb_run_id": wandb_run_id,
        "data": fingerprint(run.stream),
        WEIGHTS: weights_sha256(run.stream),
    }


def dropped(clients: int) -> dict[str, Any]:
    """What a checkpoint holds in place of a method's client states that a finished run dropped."""
    return {"store": DROPPED, "clients": clients}


DIGEST = "sha256"  # the key of the checkpoint's own content digest


def content_digest(payload: dict[str, Any]) -> str:
    """SHA-256 of everything in ``payload`` but its digest: each tensor's dtype, shape and bytes and every plain
    value, in the payload's order; equal for the payload written and the one ``torch.load`` gives back."""
    hasher = hashlib.sha256()

    def feed(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            flat = obj.detach().to("cpu").contiguous().reshape(-1)
            hasher.update(f"T{obj.dtype}{tuple(obj.shape)};".encode())
            hasher.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        elif isinstance(obj, dict):
            hasher.update(f"D{len(obj)};".encode())
            for key, value in obj.items():
                hasher.update(f"{key!r}:".encode())
                feed(value)
        elif isinstance(obj, (list, tuple)):
            hasher.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
            for value in obj:
                feed(value)
        else:
            hasher.update(f"{type(obj).__name__}:{obj!r};".encode())

    feed({k: v for k, v in payload.items() if k != DIGEST})
    return hasher.hexdigest()


def save(run_dir: Path, payload: dict[str, Any]) -> Path:
    """Replace ``run_dir/checkpoint.pt`` atomically and durably, with the digest of its content."""
    payload = {**payload, DIGEST: content_digest(payload)}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    path = checkpoint_path(run_dir)
    atomic_write_bytes(path, buffer.getvalue())
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
    return path


def remove_stale_temp_files(run_dir: Path) -> None:
    """Delete half-written temp files that a killed process left next to the checkpoint."""
    for tmp in Path(run_dir).glob(f".{CHECKPOINT}.*"):
        tmp.unlink(missing_ok=True)


# ---- what comes out ----
def load(run_dir: Path) -> dict[str, Any]:
    """Read a run directory's checkpoint (CPU tensors), refusing a missing or damaged one (exit code 2)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory")
    path = checkpoint_path(run_dir)
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no {CHECKPOINT} in it (the run never started, or it is not a run "
                          f"directory); start it again with --overwrite")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same refusal
        raise ConfigError(f"--resume {run_dir}: {path.name} is unreadable ({type(err).__name__}: {err}); "
                          f"start the run again with --overwrite") from None
    keys = {"format", "config", "params", "states", "comm", "progress", "rng", "wandb_run_id"}
    if isinstance(payload, dict) and isinstance(payload.get("format"), int) and payload["format"] < FORMAT:
        raise ConfigError(f"--resume {run_dir}: {path.name} has format {payload['format']}, written by an older cfl "
                          f"whose method states this version cannot read (this one writes format {FORMAT}); "
                          f"start the run again with --overwrite, or resume it with the cfl that wrote it")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or keys - set(payload):
        raise ConfigError(f"--resume {run_dir}: {path.name} is not a cfl checkpoint of format {FORMAT}")
    if any(isinstance(st, dict) and isinstance(st.get("clients"), dict) and st["clients"].get("store") == DROPPED
           for st in payload["states"]) or any(payload.get(k, {}).get("store") == DROPPED
                                               for k in ("optimizer_states", "buffer_states")):
        raise ConfigError(f"--resume {run_dir}: this run finished and dropped its client states "
                          f"(keep_client_states: false), which a resumed run needs; its outputs (results.json) are "
                          f"complete. To train it again, run its config with --overwrite and keep_client_states: true")
    check_digest(payload, path, run_dir)
    if payload["wandb_run_id"] is not None:  # handed to wandb.init, which puts it in paths
        checked_id(payload["wandb_run_id"], f"--resume {run_dir}: the W&B run id in {path.name}",
                   "start the run again with --overwrite")
    return payload


def check_digest(payload: dict[str, Any], path: Path, run_dir: Path) -> None:
    """Refuse a checkpoint whose content no longer matches the digest cfl wrote into it; one written before
    digests existed is resumed with a printed warning (it cannot be checked)."""
    recorded = payload.get(DIGEST)
    if recorded is None:
        print(f"cfl: warning: {path} holds no checksum (written by an older cfl); it cannot be checked against "
              f"changes made after it was written", file=sys.stderr)
        return
    computed = content_digest(payload)
    if computed != recorded:
        raise ConfigError(f"--resume {run_dir}: {path} was changed after cfl wrote it: its content no longer "
                          f"matches the SHA-256 cfl recorded in it (recorded {str(recorded)[:16]}..., computed "
                          f"{computed[:16]}...), so the weights or states it would resume from are not the run's; "
                          f"restore the file cfl wrote, or start the run again with --overwrite")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def config_changes(saved: dict[str, Any], cfg: Config) -> str:
    """``key: old in the checkpoint, new now`` for each key that would change results ('' when none)."""
    saved = {"schedule": to_dict(ScheduleConfig()), **saved}  # a checkpoint from before schedules: synchronous
    old, new = _flat(with_added_keys(resolve_saved_model(saved))), _flat(cfg.to_dict())
    unread = unread_model_keys(old) & unread_model_keys(new)  # adapter keys neither run's model.train reads
    old, new = ({k: v for k, v in flat.items() if k not in unread} for flat in (old, new))
    # schedule.forgetting trains nothing: it says how results.json reads the evaluations, which the resumed run
    # computes at its end with the config it resumes with (a checkpoint from before the key lacks it)
    changed = sorted(k for k in old.keys() | new.keys() if not is_resume_safe(k) and k != "schedule.forgetting"
                     and old.get(k) != new.get(k))
    return "; ".join(f"{k}: {old.get(k)!r} in the checkpoint, {new.get(k)!r} now" for k in changed)


def check_config(saved: dict[str, Any], cfg: Config, run_dir: Path) -> None:
    """Refuse to resume with a config that would change results (edited config.yaml)."""
    diffs = config_changes(saved, cfg)
    if diffs:
        raise ConfigError(f"--resume {run_dir}: config.yaml no longer matches the checkpoint ({diffs}); "
                          f"restore it, or start a new run with --out")


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to(v, device) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to(v, device) for v in obj)
    return obj


WEIGHTS = "weights_sha256"  # the pretrained backbone's weights file the run trains on (None: none, or random)


def weights_sha256(stream: Stream) -> str | None:
    """The SHA-256 of the weights file of the stream's pretrained backbone (None: no backbone, or a random one)."""
    return (stream.info.get("backbone") or {}).get("sha256")


def check_weights(payload: dict[str, Any], stream: Stream) -> None:
    """Refuse to resume on another weights file than the run trained on (the backbone trained through with
    ``model.train: prompts | components | lora`` would change under the run); a checkpoint written before the
    field existed is resumed with a printed warning (its weights cannot be checked)."""
    now = weights_sha256(stream)
    if WEIGHTS not in payload:
        if now is not None:
            print("cfl: warning: this checkpoint holds no weights SHA-256 (written by an older cfl); the weights file "
                  f"(SHA-256 {now}) cannot be checked against the one the run was trained on", file=sys.stderr)
        return
    if payload[WEIGHTS] != now:
        path = (stream.info.get("backbone") or {}).get("weights")
        raise ConfigError(f"--resume: the weights file {path!r} has SHA-256 {now}, but the run was trained on a file "
                          f"with SHA-256 {payload[WEIGHTS]}: the rest of the run would train on another backbone. "
                          f"Put back the file the run started with (model.weights_sha256 pins it), or start a new "
                          f"run with --out")


def check_data(payload: dict[str, Any], stream: Stream, cfg: Config) -> None:
    """Refuse to resume on other weights (:func:`check_weights`, first: features of other weights are other data)
    or on data whose fingerprint differs from the checkpoint's; a checkpoint written before fingerprints existed
    is resumed with a printed warning (its data cannot be checked)."""
    check_weights(payload, stream)
    saved = payload.get("data")
    if saved is None:
        print("cfl: warning: this checkpoint holds no data fingerprint (written by an older cfl); the data cannot "
              "be checked against the data the run was trained on", file=sys.stderr)
        return
    diffs = differences(saved, fingerprint(stream))
    features = (stream.info.get("backbone") or {}).get("features")
    if diffs and features is not None:
        raise ConfigError(features_changed(payload, stream, cfg, diffs))
    if diffs:
        raise ConfigError(f"--resume: the data is not the data this run was trained on ({'; '.join(diffs)}). "
                          f"The run started with data_root: {payload['config'].get('data_root')!r}, now "
                          f"{cfg.data_root!r} (null: $CFL_DATA, else ~/.cache/cfl). Point data_root "
                          f"(--set data_root=DIR) or $CFL_DATA at the run's data, or start a new run with --out")


def features_changed(payload: dict[str, Any], stream: Stream, cfg: Config, diffs: list[str]) -> str:
    """The refusal of a ``model.train: head`` resume whose features differ: the run trains on the frozen
    backbone's features of the data, so the weights file is named first (the usual cause: it was replaced),
    then the data."""
    backbone = stream.info["backbone"]
    then = (payload["config"].get("model") or {}).get("weights")
    return (f"--resume: the backbone's features are not those this run was trained on ({'; '.join(diffs)}). "
            f"Under model.train: head the run trains on the features of model.weights: now {backbone['weights']!r} "
            f"(sha256 {str(backbone['sha256'])[:16]}...), the run started with {then!r}; a weights file replaced "
            "or edited since changes every feature, as other data does (data_root: "
            f"{payload['config'].get('data_root')!r} then, {cfg.data_root!r} now). Resume with the weights file "
            "and data the run started with, or start a new run with --out")


def restore(run: RunSnapshot, payload: dict[str, Any]) -> RunSnapshot:
    """``run`` (a fresh runner's snapshot, same config) put back into the checkpointed state: the method
    states, the communication ledger and the global generators are loaded in place; the parameters and the
    progress come back in the returned snapshot (hand it to ``Runner.resume``)."""
    if set(payload["params"]) != set(run.params) or len(payload["states"]) != len(run.states):
        raise ConfigError("the checkpoint's model or methods do not match this config; start a new run with --out")
    for kind, saved_tensors, built in (("parameter", payload["params"], run.params),
                                       ("buffer", payload.get("buffers", {}), run.buffers)):
        for name, tensor in saved_tensors.items():
            if name in built and tuple(tensor.shape) != tuple(built[name].shape):
                raise ConfigError(f"--resume: the checkpoint's model {kind} '{name}' has shape {tuple(tensor.shape)}, "
                                  f"this run's model has {tuple(built[name].shape)}: the checkpoint is of another "
                                  f"model (a plugin's model changed since the run started?); resume with the model "
                                  f"it was trained with, or start a new run with --out")
    params = {k: v.to(run.device) for k, v in payload["params"].items()}
    buffers = {k: v.to(run.device) for k, v in payload.get("buffers", {}).items()}  # none before they were carried
    if set(buffers) != set(run.buffers):
        raise ConfigError("the checkpoint's model buffers (BatchNorm running statistics) do not match this model's; "
                          "start a new run with --out")
    for method, state, saved in zip(run.methods, run.states, payload["states"], strict=True):
        try:
            state.load_state_dict(_to(saved, run.device))
        except ValueError as err:  # a client-state store that cannot take the checkpoint's client states
            raise ConfigError(f"--resume: the client states of method '{method.name}' named by the checkpoint (after "
                              f"round {payload['progress']['global_round']}): {err}") from None
    if run.optimizer_states is not None:  # optimizer.state: kept (the config check makes it the run's setting)
        run.optimizer_states.load_state_dict(_to(payload.get("optimizer_states", {}), run.device))
    if run.buffer_states is not None:  # model.buffers: local (the config check makes it the run's setting)
        run.buffer_states.load_state_dict(_to(payload.get("buffer_states", {}), run.device))
    run.comm.load_state_dict(payload["comm"])
    progress = Progress(**payload["progress"])
    set_rng_state(payload["rng"])
    backbone = {k: v.to(run.device) for k, v in payload.get("backbone", {}).items()}
    return dataclasses.replace(run, params=params, progress=progress, buffers=buffers, backbone=backbone)
