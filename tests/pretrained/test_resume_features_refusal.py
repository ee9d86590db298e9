"""A ``model.train: head`` resume whose features differ from the checkpoint's names the weights file (the
run trains on the backbone's features, which a replaced weights file changes) before the data."""

from __future__ import annotations

import pytest

from cfl.config.schema import ConfigError
from cfl.data.fingerprint import fingerprint
from cfl.engine.stores.checkpoint import check_data
from tests.conftest import make_stream, tiny_config


def _features_stream(seed: int, weights: str, sha256: str):
    stream = make_stream(seed=seed)
    stream.info["backbone"] = {"name": "vit-ti16", "weights": weights, "sha256": sha256, "random": False,
                               "features": {"source": "computed", "cache": "/cache/x.pt", "width": 12}}
    return stream


def test_a_head_mode_resume_on_other_features_names_the_weights_file():
    cfg = tiny_config()
    saved = fingerprint(_features_stream(0, "/w/vit.safetensors", "a" * 64))
    payload = {"data": saved, "config": {"model": {"weights": "/w/vit.safetensors"}, "data_root": None}}
    now = _features_stream(1, "/w/vit.safetensors", "b" * 64)  # the same path, another file: other features
    with pytest.raises(ConfigError) as err:
        check_data(payload, now, cfg)
    text = str(err.value)
    for word in ["the backbone's features are not those this run was trained on", "model.weights",
                 "'/w/vit.safetensors'", "sha256 bbbbbbbbbbbbbbbb", "a weights file replaced", "--out"]:
        assert word in text, (word, text)
    assert not text.startswith("--resume: the data is not the data")


def test_a_resume_on_other_raw_data_still_names_the_data():
    cfg = tiny_config()
    payload = {"data": fingerprint(make_stream(seed=0)), "config": {"data_root": None}}
    with pytest.raises(ConfigError, match="the data is not the data this run was trained on"):
        check_data(payload, make_stream(seed=1), cfg)
