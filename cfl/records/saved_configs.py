"""How a config saved by an older cfl reads today: the keys added since, with the value it ran with.

A saved config (a checkpoint's ``config.yaml``, a record's ``results.json``) holds the keys of the cfl that wrote
it. A key added later is absent there; compared with today's default it would look changed even where the old run
behaved exactly as that default does, and where the default changed the behaviour (CODA-P's prefix form) it must
look changed. :data:`ADDED` says, per key, the value that reproduces what a config without it ran; a key not listed
there reads as today's default. Model adapter keys that the saved run's ``model.train`` does not read
(``cfl/config/adapter_keys.py``) are left out of a comparison: they change nothing. Used by
``cfl run --resume`` and the campaign's check that a record is of its sweep's config (``config_changes``).
"""

from __future__ import annotations

from typing import Any

from cfl.config.adapter_keys import ADAPTER_KEYS

#: dotted key -> (the methods it applies to, or None: every run; the value a config saved before it ran with)
ADDED: dict[str, tuple[tuple[str, ...] | None, Any]] = {
    # 2026-11: a flag that a weights file is trained though it looks initialised; absent: not claimed (False)
    "model.weights_trained": (None, False),
    # 2026-12-03: CODA-P's prefix form became the default (5); before it, the prompt was prepended (0)
    "model.component_layers": (None, 0),
    # 2026-12-03: CODA-P's per-task slices became the default (gram-schmidt); before it, every component trained
    # at every task (codap) and every slice was in the forward from the start (fedcprompt): at-once
    "method.start": (("codap", "fedcprompt"), "at-once"),
    # 2026-12-03: PILoRA's model keys; before them, LoRA adapted every block's whole qkv, one set for every task, and
    # the classifier was linear
    "model.lora_targets": (None, "qkv"),
    "model.lora_layers": (None, 0),
    "model.lora_tasks": (None, "shared"),
    "model.classifier": (None, "linear"),
    # 2026-12-03: a weights file's origin shown beside the method; before it, none was shown
    "model.weights_origin": (None, None),
}


def with_added_keys(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` (a nested config mapping) with each key of :data:`ADDED` it lacks set to its old value."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    method = (out.get("method") or {}).get("name") if isinstance(out.get("method"), dict) else None
    for dotted, (methods, value) in ADDED.items():
        section, key = dotted.split(".")
        if methods is not None and method not in methods:
            continue
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section][key] = value
    return out


def unread_model_keys(flat: dict[str, Any]) -> set[str]:
    """The dotted adapter keys (``model.prompt_pool``, ...) the flat config's ``model.train`` does not read."""
    read = set(ADAPTER_KEYS.get(flat.get("model.train"), ()))
    return {f"model.{k}" for keys in ADAPTER_KEYS.values() for k in keys if k not in read}
