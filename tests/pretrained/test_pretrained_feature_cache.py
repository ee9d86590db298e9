"""The feature cache (docs/pretrained.md, "The feature cache"): a damaged file, another key's file copied under
this one's name, or an older cfl's file is recomputed with a warning; a full disk while writing it is said, its
temporary removed and the run goes on; temporaries a killed run left are removed."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")
pytest.importorskip("safetensors", reason="the pretrained backbones need the extra pretrained")

from safetensors.torch import save_file  # noqa: E402

from cfl.pretrained.backbones import build_backbone  # noqa: E402
from cfl.validation import from_dict  # noqa: E402
from tests.weights_files import as_trained  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    """Two weights files of one architecture (another backbone each)."""
    folder = tmp_path_factory.mktemp("weights")
    out = []
    for seed in (5, 6):
        torch.manual_seed(seed)
        state = as_trained(build_backbone("vit-ti16", SIZE).state_dict(), seed)
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / f"w{seed}.safetensors"))
        out.append(folder / f"w{seed}.safetensors")
    return out[0], out[1]


def cfg_of(tmp_path: Path, weights: Path):
    return from_dict({"stream": {"name": "split-digits", "num_tasks": 2},
                      "model": {"name": "vit-ti16", "image_size": SIZE, "weights": str(weights)},
                      "num_clients": 3, "clients_per_round": 3, "rounds_per_task": 1, "batch_size": 16,
                      "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}})


def features(cfg, capsys) -> tuple[object, str, list[str]]:
    from cfl.data.load import load_stream
    from cfl.pretrained.features import feature_stream

    raw = load_stream(**cfg.stream_fields(), device=torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = feature_stream(cfg, raw, torch.device("cpu"))
    return stream, capsys.readouterr().err, [str(w.message) for w in caught]


def cache_file(stream) -> Path:
    return Path(stream.info["backbone"]["features"]["cache"])


def test_a_damaged_or_foreign_cache_file_is_recomputed_with_a_warning(files, tmp_path, capsys):
    a, b = files
    first, _, _ = features(cfg_of(tmp_path, a), capsys)
    path = cache_file(first)
    payload = torch.load(path, weights_only=True)
    payload["features"][0]["train"][0, 0] += 1.0  # a flipped float
    torch.save(payload, path)
    again, err, said = features(cfg_of(tmp_path, a), capsys)
    assert "computed in" in err and any("digest differs" in w for w in said)
    assert all(torch.equal(x.train_x, y.train_x) for x, y in zip(first.tasks, again.tasks, strict=True))
    other, _, _ = features(cfg_of(tmp_path, b), capsys)
    cache_file(other).replace(path)  # another backbone's file copied under this key
    _, err, said = features(cfg_of(tmp_path, a), capsys)
    assert "computed in" in err and any("is the cache of another backbone or data" in w for w in said)
    torch.save(payload["features"], path)  # an older cfl's file: the features alone
    _, err, said = features(cfg_of(tmp_path, a), capsys)
    assert "computed in" in err and any("holds no key and digest" in w for w in said)
    _, err, said = features(cfg_of(tmp_path, a), capsys)
    assert "loaded from the cache" in err and not said


def test_a_full_disk_while_writing_the_cache_is_said_and_the_run_goes_on(files, tmp_path, capsys, monkeypatch):
    import cfl.pretrained.features as cache

    def disk_full(obj: object, f: object) -> None:  # noqa: ARG001 - torch.save on a full disk: part written, then fails
        Path(f).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(cache.torch, "save", disk_full)
    stream, err, _ = features(cfg_of(tmp_path, files[0]), capsys)
    path = cache_file(stream)
    assert "features: could not write the feature cache" in err and "computing them again on each run" in err
    assert stream.tasks[0].train_x.shape[1] == 192 and not path.exists()
    assert not list(path.parent.glob("*.tmp*"))


def test_temporaries_of_a_killed_run_are_removed(files, tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = tmp_path / "data" / "cache" / "features"
    folder.mkdir(parents=True)
    stale = folder / f"vit-ti16-0123456789abcdefghij.tmp{int(dead.stdout)}"
    stale.write_bytes(b"x" * 1000)
    _, err, _ = features(cfg_of(tmp_path, files[0]), capsys)
    assert not stale.exists() and f"removed 1 temporary file(s) a killed run left in {folder}" in err


def test_the_runs_outputs_name_the_feature_cache(files, tmp_path, capsys):
    """The cache lies outside the run directory (under data_root): the outputs line and results.json name it."""
    from cfl.app.single_run import execute

    results = execute(cfg_of(tmp_path, files[0]), tmp_path / "run")
    path = Path(results["backbone"]["features"]["cache"])
    assert path.is_file() and path.parent == tmp_path / "data" / "cache" / "features"
    out = capsys.readouterr().out
    assert f"outputs: {tmp_path / 'run'}/ (" in out and f"; feature cache: {path}" in out, out
