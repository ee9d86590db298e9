"""The method interface as a whole: its hooks (introspection of ``Method``), the generated table of them in
docs/plugins.md, and the refusal of a class written for the interface before its hooks became concepts."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from cfl.config.schema import ConfigError
from cfl.methods.base import Method
from cfl.methods.hook_table import hooks, main, markdown, users
from cfl.methods.old_interface import OLD_HOOKS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def test_the_hooks_are_the_interfaces_functions_and_no_old_name_is_among_them():
    names = hooks()
    assert "server_event" in names and "count_bytes" in names and "param_roles" in names
    merged = ("server_start", "before_task_end", "server_end", "after_server_step", "backbone_update", "upload_bytes",
              "payload_bytes", "client_state_bytes", "local_params", "frozen_params", "task_loss", "extra_loss",
              "replay", "step_samples", "penalty", "layer_preconditioner", "gradient_projection", "carry_start",
              "local_steps_per_epoch")
    assert set(merged) <= set(OLD_HOOKS) and not set(merged) & set(names)
    assert len(names) == 14  # 27 before: each concept one hook taking one context object


def test_every_hook_takes_one_context_object():
    """Each hook of the interface takes ``self`` and one context (``check`` is the config's classmethod)."""
    for name in hooks():
        params = list(inspect.signature(getattr(Method, name)).parameters)
        assert len(params) == 2 and params[0] == "self", (name, params)


def test_the_docs_table_is_the_generated_one():
    assert main(["--check", str(PAGE)]) == 0, "run python -m cfl.methods.hook_table --write docs/plugins.md"
    assert "| `server_event` |" in markdown()
    assert "lorm" in users("server_event") and "fedweit" in users("param_roles")


@pytest.mark.parametrize(("body", "named"), [
    ("def server_start(self, server, global_params):\n        pass", "server_start -> server_event(ctx)"),
    ("def upload_bytes(self, sent, info):\n        return 0", "upload_bytes -> count_bytes(ctx)"),
    ("def local_params(self, names):\n        return []", "local_params -> param_roles(ctx)"),
    ("def after_server_step(self, model, global_params, server, task):\n        pass",
     "after_server_step -> server_event(ctx)"),
    ("def client_upload(self, params, state):\n        return {}, {}",
     "client_upload(params, state) -> client_upload(ctx)"),
    ("def server_update(self, global_params, delta, server, server_lr):\n        pass",
     "server_update(global_params, delta, server, server_lr) -> server_update(ctx)"),
])
def test_a_class_of_the_old_interface_is_refused_naming_each_replacement(body, named):
    namespace: dict = {}
    exec(f"def f(self):\n    pass\nclass Holder:\n    {body}\n", namespace)  # noqa: S102 - a test's own source
    hook = next(k for k in vars(namespace["Holder"]) if not k.startswith("_"))
    with pytest.raises(ConfigError) as caught:
        type("Old", (Method,), {hook: vars(namespace["Holder"])[hook]})
    assert named in str(caught.value) and 'docs/plugins.md, "The hooks"' in str(caught.value)


def test_a_class_of_the_new_interface_is_not_refused():
    class New(Method):
        name = "new"

        def server_event(self, ctx):
            return None

        def count_bytes(self, ctx):
            return None

    assert New.name == "new"
