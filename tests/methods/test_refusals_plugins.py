"""Every way a plugin can fail, through the real ``cfl`` command (a subprocess): exit code 2 before any file is
written (naming the plugin file, the hook and the rule), or 3 during training with the checkpoint kept, and
never a traceback; registered names and run directory paths that the file system or ``runs/`` cannot hold."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cfl.methods.old_interface import OLD_DECLARATIONS

ROOT = Path(__file__).resolve().parents[2]
TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 2, "batch_size": 32, "threads": 1, "wandb": {"mode": "disabled"}}
HEAD = ("import sys\nimport torch\nfrom cfl.methods import register\n"
        "from cfl.methods.base import (ClientStart, Computes, Draw, LossTerms, Method, ParamRoles, Quadratic, "
        "RoundTerms, Samples, Sends)\n")


def method(name: str, body: str, cls: str = "Bad") -> str:
    """A plugin file registering method ``name`` with the class body ``body`` (indented by 4)."""
    return f"{HEAD}\n@register\nclass {cls}(Method):\n    name = {name!r}\n{body}"


#: a value of each old declaration (cfl/methods/old_interface.py), as a plugin of the old interface wrote it
OLD_VALUES = {"broadcast": {"round": ("c",)}, "ragged": {"bases": 1}, "downloads_model_at_task_end": False,
              "client_events": ("task_end",), "sequential_reason": "scipy", "unread_keys": {"server_lr": "own"},
              "models": ("mlp",), "running_stats_model": "resnet18-reduced-running-bn", "backbone_only": True,
              "model_train": "head", "scenarios": ("class",), "scenarios_why": "one head",
              "schedules": ("synchronous",), "schedules_why": "one task", "server_task_end": "last_holder",
              "losses": ("extra",), "draws": ("step",), "terms": ("penalty",), "starts": ("carry",)}
TASK_END_MARK = ("    sends = Sends(client_events=('task_end',))\n"
                 "    def client_end(self, ctx):\n"
                 "        ctx.state['seen'] = torch.ones(1)\n")
PLUGINS = {
    "raises": "x = 1\nraise RuntimeError('boom at import')\n",
    "imports": "import cfl_no_such_module_xyz\n",
    "exits": "import sys\nsys.exit(0)\n",
    "events": method("ev", "    sends = Sends(client_events=('rounds',))\n"),
    "dotdot": method("../evil", ""),
    "slash": method("x/y", ""),
    "escaped": method("x/../../../escaped", ""),
    "huge": method("m" * 5000, ""),
    "long3": "\n".join(method(c * 100, "", f"M{c}") for c in "abc"),  # three names of 100: one label of 300
    "penalty_key": method("pk", "    computes = Computes(terms=('penalty',))\n"
                                "    def round_terms(self, ctx):\n"
                                "        return RoundTerms(penalty={'nope': Quadratic(1.0, torch.zeros(3))})\n"),
    "penalty_raises": method("pr", "    computes = Computes(terms=('penalty',))\n"
                                   "    def round_terms(self, ctx):\n        return 1 / 0\n"),
    "extra_shape": method("es", "    computes = Computes(losses=('extra',))\n"
                                "    def loss(self, ctx):\n"
                                "        return LossTerms(extra=ctx.x.sum())\n"),
    "hook_exits": method("he", "    computes = Computes(terms=('projection',))\n"
                               "    def round_terms(self, ctx):\n        sys.exit(0)\n"),
    "late_projection": method("lp", TASK_END_MARK + "    computes = Computes(terms=('projection',))\n"
                                    "    def round_terms(self, ctx):\n"
                                    "        return RoundTerms(projection={'body.1.weight': torch.zeros(3, 1)} "
                                    "if 'seen' in ctx.state else {})\n"),
    "late_item": method("li", TASK_END_MARK + "    computes = Computes(losses=('extra',))\n"
                              "    def loss(self, ctx):\n"
                              "        x, state = ctx.x, ctx.state\n"
                              "        if 'seen' in state and state['seen'].sum().item() > 0:\n"
                              "            return LossTerms(extra=x.new_zeros(x.shape[0]))\n"
                              "        return LossTerms(extra=x.new_zeros(x.shape[0]))\n"),
    "late_client_end": method("lc", "    sends = Sends(client_events=('task_end',))\n"
                                    "    def client_end(self, ctx):\n"
                                    "        raise KeyError('fisher')\n"),
    # a taken name, by another definition (the same definition registered again replaces)
    "takes_fedavg": method("fedavg", "", "MyAvg"),
    "takes_mine": method("mine", "", "Mine"),
    "takes_mine_too": method("mine", "", "Mine"),
    # the step hooks
    "step_shape": method("ss", "    def step_gradient(self, step):\n"
                               "        return {k: g.flatten() for k, g in step.grads.items()}\n"),
    "carry_keys": method("ck", "    computes = Computes(starts=('carry',))\n"
                               "    def client_start(self, ctx):\n"
                               "        return ClientStart(carry={'path': torch.zeros(2)})\n"
                               "    def carry_step(self, step):\n"
                               "        return {'paths': step.carry['path']}\n"),
    # parameters kept per client
    "local_name": method("ln", "    def param_roles(self, ctx):\n        return ParamRoles(local=['nope'])\n"),
    "start_shape": method("st", "    computes = Computes(starts=('params',))\n"
                                "    def client_start(self, ctx):\n"
                                "        return ClientStart(params={k: v.flatten() for k, v in ctx.params.items()})\n"),
    "sends_local": method("sl", "    def param_roles(self, ctx):\n        return ParamRoles(local=['head.weight'])\n"
                                "    def client_upload(self, ctx):\n"
                                "        return {'head.weight': ctx.params['head.weight']}, {}\n"),
    "aggregate_alone": method("aa", "    def server_aggregate(self, ctx):\n        return ctx.sent\n"),
    "negative_bytes": method("nb", "    def client_upload(self, ctx):\n"
                                   "        return {'body.1.weight': ctx.params['body.1.weight']}, {}\n"
                                   "    def count_bytes(self, ctx):\n        return -1\n"),
    "step_item": method("si2", "    def step_gradient(self, step):\n"
                               "        if step.grads['body.1.weight'].sum().item() > 0:\n"
                               "            return None\n"
                               "        return None\n"),
    # the task-end server hook, the task_start broadcast, synthetic samples reaching loss's extra part
    "broadcast_event": method("be", "    sends = Sends(broadcast={'task_begin': ('pool',)})\n"),
    # the declarations of the interface before Requires, Sends and Computes
    "old_declarations": method("od", "".join(f"    {name} = {value!r}\n" for name, value in OLD_VALUES.items())),
    "samples_shape": method("sx", "    computes = Computes(draws=('step',))\n"
                                  "    def samples(self, ctx):\n"
                                  "        n = torch.zeros(2).long()\n"
                                  "        return Draw(step=Samples(torch.zeros(2, 5), n, n))\n"),
    "samples_loss_shape": method("sl", "    computes = Computes(losses=('extra',), draws=('step',))\n"
                                       "    def samples(self, ctx):\n"
                                       "        n = torch.zeros(3).long()\n"
                                       "        return Draw(step=Samples(torch.zeros(3, 1, 8, 8), n, n))\n"
                                       "    def loss(self, ctx):\n"
                                       "        return LossTerms(extra=ctx.samples.x.flatten(1).sum(1))\n"),
    "task_end_returns": method("tr", "    sends = Sends(server_events=('before_task_end',))\n"
                                     "    def server_event(self, ctx):\n"
                                     "        return {'pool': torch.zeros(1)}\n"),
    "task_start_changed": method("tc", "    sends = Sends(broadcast={'task_start': ('pool',)},\n"
                                       "                  server_events=('round', 'task_end'))\n"
                                       "    def server_event(self, ctx):\n"
                                       "        ctx.server['pool'] = torch.ones(1)  # a new tensor each round\n"),
    # failures that escaped as tracebacks or went unnoticed
    "carry_counter": method("cc", "    calls = 0\n"
                                  "    computes = Computes(starts=('carry',))\n"
                                  "    def client_start(self, ctx):\n"
                                  "        Bad.calls += 1  # module-level state: each client gets another size\n"
                                  "        return ClientStart(carry={'path': torch.zeros(Bad.calls)})\n"),
    "carry_grows": method("cg", "    sends = Sends(client_events=('round',))\n"
                                "    computes = Computes(starts=('carry',))\n"
                                "    def client_start(self, ctx):\n"
                                "        n = ctx.state['path'].shape[0] + 1 if 'path' in ctx.state else 1\n"
                                "        return ClientStart(carry={'path': torch.zeros(n)})\n"
                                "    def carry_step(self, step):\n"
                                "        return {'path': step.carry['path'] + 1}\n"
                                "    def client_end(self, ctx):\n"
                                "        return None\n"),
    "state_sizes": method("ssz", "    sends = Sends(client_events=('task_end',))\n"
                                 "    calls = 0\n"
                                 "    def client_end(self, ctx):\n"
                                 "        Bad.calls += 1  # each client keeps another size\n"
                                 "        ctx.state['mem'] = torch.zeros(Bad.calls)\n"
                                 "    computes = Computes(losses=('task',))\n"
                                 "    def loss(self, ctx):\n"
                                 "        return LossTerms(task=torch.nn.functional.cross_entropy(ctx.logits, ctx.y, "
                                 "reduction='none'))\n"),
    "loss_no_grad": method("ng", "    computes = Computes(losses=('task',))\n"
                                 "    def loss(self, ctx):\n"
                                 "        return LossTerms(task=torch.zeros(ctx.logits.shape[0]))\n"),
    "late_loss_no_grad": method("lng", TASK_END_MARK + "    computes = Computes(losses=('task',))\n"
                                                       "    def loss(self, ctx):\n"
                                                       "        if 'seen' in ctx.state:\n"
                                                       "            return LossTerms(task=torch.zeros("
                                                       "ctx.logits.shape[0]))\n"
                                                       "        ce = torch.nn.functional.cross_entropy\n"
                                                       "        return LossTerms(task=ce(ctx.logits, ctx.y, "
                                                       "reduction='none'))\n"),
    "server_function": method("sf", "    sends = Sends(server_events=('round',))\n"
                                    "    def server_event(self, ctx):\n"
                                    "        ctx.server['score'] = lambda: 1\n"),
    "late_server_function": method("lsf", "    sends = Sends(server_events=('round',))\n"
                                          "    def server_event(self, ctx):\n"
                                          "        if ctx.task == 1:\n"
                                          "            ctx.server['score'] = lambda: 1\n"),
    "step_branch": method("sbr", "    def step_gradient(self, step):\n"
                                 "        if step.grads['body.1.weight'].sum() > 0:\n"
                                 "            return None\n"
                                 "        return None\n"),
    "steps_zero": method("sz", "    computes = Computes(starts=('steps',))\n"
                               "    def client_start(self, ctx):\n        return ClientStart(steps=0)\n"),
    "preconditioner_shape": method("pc", "    computes = Computes(terms=('preconditioner',))\n"
                                         "    def round_terms(self, ctx):\n"
                                         "        return RoundTerms(preconditioner={'body.1.weight': torch.eye(3)})\n"),
    "step_integer": method("sint", "    def step_gradient(self, step):\n"
                                   "        return {k: g.long() for k, g in step.grads.items()}\n"),
    "update_integer": method("uint", "    def transform_update(self, ctx):\n"
                                     "        return {k: d.long() for k, d in ctx.delta.items()}\n"),
    "step_writes": method("sw", "    def step_gradient(self, step):\n"
                                "        step.params['body.1.weight'].mul_(0.5)\n"
                                "        return None\n"),
    "server_writes": method("aw", "    sends = Sends(server_events=('round',))\n"
                                  "    def server_event(self, ctx):\n"
                                  "        ctx.global_params['body.1.weight'].mul_(0.5)\n"),
    "step_nan": method("sn", TASK_END_MARK + "    def step_gradient(self, step):\n"
                                             "        if 'seen' not in step.state:\n"
                                             "            return None\n"
                                             "        return {k: g / (step.state['seen'] - 1) for k, g in "
                                             "step.grads.items()}\n"),
}
BENCHMARK = "import sys\n\ndef make():\n    sys.exit(0)\n"  # a stream.benchmark callable ending the process
NAME_RULE = "must be letters, digits, '-', '_' or '.'"

# (case, argv with {placeholders}, exit code, words the message must contain)
CASES = [
    ("import raises: run", ["run", "{cfg}", "--plugin", "{tmp}/raises.py"], 2,
     ["plugin file '{tmp}/raises.py'", "at line 2", "RuntimeError: boom at import"]),
    ("import raises: list", ["list", "--plugin", "{tmp}/raises.py"], 2, ["raises.py", "RuntimeError: boom"]),
    ("import raises: sweep --jobs 2", ["sweep", "{sweep}", "--jobs", "2", "--plugin", "{tmp}/raises.py"], 2,
     ["raises.py", "RuntimeError: boom"]),
    ("ImportError in a plugin", ["run", "{cfg}", "--plugin", "{tmp}/imports.py"], 2,
     ["imports.py", "ModuleNotFoundError: No module named 'cfl_no_such_module_xyz'", "install the missing module"]),
    ("unknown client_events entry", ["list", "--plugin", "{tmp}/events.py"], 2,
     ["events.py", "client_events names the event(s) ['rounds']", "they are ['round', 'task_end']"]),
    ("sys.exit(0) in a plugin file", ["run", "{cfg}", "--plugin", "{tmp}/exits.py"], 2,
     ["exits.py", "at line 2", "sys.exit(0)"]),
    ("sys.exit(0) in a stream.benchmark callable",
     ["run", "{cfg}", "--set", "stream={{name: avalanche, benchmark: cfl_test_exit_benchmark.make, args: {{}}}}"], 2,
     ["'stream.benchmark: cfl_test_exit_benchmark.make' failed", "sys.exit(0)"]),
    ("method name with ..", ["run", "{cfg}", "--plugin", "{tmp}/dotdot.py", "--set", "method.name=../evil"], 2,
     ["dotdot.py", "method name '../evil'", NAME_RULE]),
    ("method name with a slash", ["run", "{cfg}", "--plugin", "{tmp}/slash.py", "--set", "method.name=x/y"], 2,
     ["slash.py", "method name 'x/y'", NAME_RULE]),
    ("method name escaping the working directory", ["run", "{cfg}", "--plugin", "{tmp}/escaped.py"], 2,
     ["method name 'x/../../../escaped'", NAME_RULE]),
    ("method name of 5000 characters", ["list", "--plugin", "{tmp}/huge.py"], 2,
     ["huge.py", "has 5000 characters; at most 100"]),
    ("default run directory name too long", ["run", "{cfg}", "--plugin", "{tmp}/long3.py", "--set",
                                             f"method.name={'a' * 100}", "--set",
                                             f"plugins=[{{{{name: {'b' * 100}}}}}, {{{{name: {'c' * 100}}}}}]"], 2,
     ["run directory 'runs/split-digits-aaaa", "bytes long", "NAME_MAX"]),
    ("--out name too long", ["run", "{cfg}", "--out", "{tmp}/" + "o" * 300], 2, ["is 300 bytes long", "NAME_MAX"]),
    ("--out path too long", ["run", "{cfg}", "--out", "{tmp}/" + "deep/" * 900], 2, ["bytes long", "PATH_MAX"]),
    ("round_terms penalty: a key that is no parameter", ["run", "{cfg}", "--plugin", "{tmp}/penalty_key.py", "--set",
                                             "method.name=pk", "--out", "{tmp}/pk"], 2,
     ["method 'pk' (Bad in {tmp}/penalty_key.py), hook round_terms", "must give as penalty None or",
      "{{parameter name: Quadratic(weight, anchor)",
      "'nope' is not a parameter", "body.1.weight"]),
    ("round_terms raises", ["run", "{cfg}", "--plugin", "{tmp}/penalty_raises.py", "--set", "method.name=pr", "--out",
                        "{tmp}/pr"], 2,
     ["method 'pr'", "penalty_raises.py", "hook round_terms raised ZeroDivisionError: division by zero"]),
    ("round_terms raises: nothing left of the default run directory, runs/ included",
     ["run", "{cfg}", "--plugin", "{tmp}/penalty_raises.py", "--set", "method.name=pr"], 2,
     ["method 'pr'", "hook round_terms raised ZeroDivisionError"]),
    ("loss: a scalar extra part instead of (B,)", ["run", "{cfg}", "--plugin", "{tmp}/extra_shape.py", "--set",
                                              "method.name=es", "--out", "{tmp}/es"], 2,
     ["hook loss", "tensor of shape (B,)", "got a torch.float32 tensor of shape ()"]),
    # step hooks breaking their rules, refused by the dry call before any file
    ("step_gradient: a gradient of the wrong shape", ["run", "{cfg}", "--plugin", "{tmp}/step_shape.py", "--set",
                                                      "method.name=ss", "--out", "{tmp}/ss"], 2,
     ["method 'ss'", "hook step_gradient", "tensor shaped like it", "for 'body.1.weight'"]),
    ("carry_step: other keys than step.carry", ["run", "{cfg}", "--plugin", "{tmp}/carry_keys.py", "--set",
                                                "method.name=ck", "--out", "{tmp}/ck"], 2,
     ["method 'ck'", "hook carry_step", "expected keys ['path']", "got keys ['paths']"]),
    ("sys.exit(0) in a hook", ["run", "{cfg}", "--plugin", "{tmp}/hook_exits.py", "--set", "method.name=he",
                               "--out", "{tmp}/he"], 2,
     ["method 'he'", "hook round_terms", "sys.exit(0)"]),
    ("mid-run: projection of the wrong shape under vmap", ["run", "{cfg}", "--plugin", "{tmp}/late_projection.py",
                                                           "--set", "method.name=lp", "--out", "{tmp}/lp"], 3,
     ["method 'lp'", "late_projection.py", "hook round_terms", "must give as projection", "basis (d, k)", "(d = 64)",
      "shape (3, 1)", "at task 1 (0-based), round 1 of the task", "checkpoint (after round 2) is kept",
      "cfl run --resume {tmp}/lp"]),
    ("mid-run: .item() under vmap", ["run", "{cfg}", "--plugin", "{tmp}/late_item.py", "--set", "method.name=li",
                                     "--out", "{tmp}/li"], 3,
     ["method 'li'", "hook loss raised RuntimeError: vmap", "pure tensor functions", "is kept"]),
    ("mid-run: client_end raises at a task end", ["run", "{cfg}", "--plugin", "{tmp}/late_client_end.py", "--set",
                                                  "method.name=lc", "--out", "{tmp}/lc"], 3,
     ["method 'lc'", "hook client_end raised KeyError: 'fisher'", "at the end of task 0 (0-based)", "is kept"]),
    # parameters kept per client, refused by the dry call or the config check before any file
    ("param_roles: a name that is no parameter", ["run", "{cfg}", "--plugin", "{tmp}/local_name.py", "--set",
                                                   "method.name=ln", "--out", "{tmp}/ln"], 2,
     ["method 'ln'", "hook param_roles", "parameter names", "local names ['nope']", "body.1.weight"]),
    ("client_start params: the wrong shape", ["run", "{cfg}", "--plugin", "{tmp}/start_shape.py", "--set",
                                                     "method.name=st", "--out", "{tmp}/st"], 2,
     ["method 'st'", "hook client_start", "must give as params",
      "{{every parameter name: tensor shaped like it}}", "for 'body.1.weight'"]),
    ("client_upload: sends a parameter kept per client", ["run", "{cfg}", "--plugin", "{tmp}/sends_local.py", "--set",
                                                          "method.name=sl", "--out", "{tmp}/sl"], 2,
     ["method 'sl'", "hook client_upload", "'head.weight' is kept per client (param_roles local), never sent"]),
    ("server_aggregate without client_upload", ["run", "{cfg}", "--plugin", "{tmp}/aggregate_alone.py", "--set",
                                                "method.name=aa", "--out", "{tmp}/aa"], 2,
     ["method aa overrides server_aggregate but not client_upload", "would never be called"]),
    ("count_bytes: a negative count", ["run", "{cfg}", "--plugin", "{tmp}/negative_bytes.py", "--set",
                                        "method.name=nb", "--out", "{tmp}/nb"], 2,
     ["method 'nb'", "hook count_bytes", "an int >= 0 (bytes)", "got int -1"]),
    # a taken name
    ("a plugin taking a built-in method's name", ["list", "--plugin", "{tmp}/takes_fedavg.py"], 2,
     ["plugin file '{tmp}/takes_fedavg.py' at line 6: method 'fedavg' is already registered (by FedAvg in ",
      "MyAvg in {tmp}/takes_fedavg.py is another definition", "choose another name"]),
    ("two plugin files registering one name", ["run", "{cfg}", "--plugin", "{tmp}/takes_mine.py", "--plugin",
                                               "{tmp}/takes_mine_too.py"], 2,
     ["method 'mine' is already registered (by Mine in {tmp}/takes_mine.py; Mine in {tmp}/takes_mine_too.py is "
      "another definition)"]),
    # the task-end server hook, the task_start broadcast, synthetic samples reaching loss's extra part
    ("an unknown broadcast event", ["list", "--plugin", "{tmp}/broadcast_event.py"], 2,
     ["broadcast_event.py", "broadcast names the event(s) ['task_begin']",
      "they are ['round', 'task_start', 'task_end']"]),
    ("old declarations, each named with what replaces it", ["run", "{cfg}", "--plugin", "{tmp}/old_declarations.py",
                                                            "--set", "method.name=od", "--out", "{tmp}/od"], 2,
     ["old_declarations.py", "uses the old declaration interface", 'docs/plugins.md, "Declarations"',
      *(f"{old} -> {new}" for old, new in OLD_DECLARATIONS.items())]),
    ("samples (step part): x of the wrong shape", ["run", "{cfg}", "--plugin", "{tmp}/samples_shape.py", "--set",
                                                    "method.name=sx", "--out", "{tmp}/sx"], 2,
     ["method 'sx'", "hook samples", "x must be of shape (n, 1, 8, 8)", "shape (2, 5)"]),
    ("loss: an extra part of one loss per drawn sample", ["run", "{cfg}", "--plugin", "{tmp}/samples_loss_shape.py",
                                                        "--set", "method.name=sl", "--out", "{tmp}/sl"], 2,
     ["method 'sl'", "hook loss", "tensor of shape (B,)", "(here 2)", "shape (3,)"]),
    ("mid-run: before_task_end returns a value", ["run", "{cfg}", "--plugin", "{tmp}/task_end_returns.py", "--set",
                                                  "method.name=tr", "--out", "{tmp}/tr"], 3,
     ["method 'tr'", "hook server_event", "must return None", "got dict", "at the end of task 0 (0-based)",
      "is kept"]),
    ("client_start carry: sizes differing", ["run", "{cfg}", "--plugin", "{tmp}/carry_counter.py", "--set",
                                                      "method.name=cc", "--out", "{tmp}/cc"], 2,
     ["method 'cc'", "hook client_start", "must give as carry", "the same keys and shapes for every client",
      "'path' has shape (2,) for one client and (3,) for another",
      "declare `computes = Computes(ragged={{'path': 0}})`"]),
    ("mid-run: client_start carry sizes differing", ["run", "{cfg}", "--plugin", "{tmp}/carry_grows.py",
                                                              "--set", "method.name=cg", "--out", "{tmp}/cg"], 3,
     ["method 'cg'", "hook client_start", "for one client and (2,) for another",
      "declare `computes = Computes(ragged={{'path': 0}})`",
      "round 2 of the task", "is kept"]),
    ("mid-run: a client state whose size differs between clients, stacked for loss",
     ["run", "{cfg}", "--plugin", "{tmp}/state_sizes.py", "--set", "method.name=ssz", "--out", "{tmp}/ssz"], 3,
     ["method 'ssz'", "hook client_end", "tensors of the same shape under a key for every client",
      "'mem' has shape (", "declare `computes = Computes(ragged={{'mem': 0}})`", "at task 1 (0-based)", "is kept"]),
    ("loss (task part): no grad_fn", ["run", "{cfg}", "--plugin", "{tmp}/loss_no_grad.py", "--set", "method.name=ng",
                               "--out", "{tmp}/ng"], 2,
     ["method 'ng'", "hook loss", "got a tensor without grad_fn"]),
    ("mid-run: loss's task part without grad_fn", ["run", "{cfg}", "--plugin", "{tmp}/late_loss_no_grad.py", "--set",
                                            "method.name=lng", "--out", "{tmp}/lng"], 3,
     ["method 'lng'", "hook loss", "got a tensor without grad_fn", "at task 1 (0-based)", "is kept"]),
    ("server_event(round): a function in server", ["run", "{cfg}", "--plugin", "{tmp}/server_function.py", "--set",
                                                 "method.name=sf", "--out", "{tmp}/sf"], 2,
     ["method 'sf'", "hook server_event", "only tensors, numbers, strings", "server['score'] is a function"]),
    ("mid-run: server_event(round) puts a function in server", ["run", "{cfg}", "--plugin",
                                                              "{tmp}/late_server_function.py", "--set",
                                                              "method.name=lsf", "--out", "{tmp}/lsf"], 3,
     ["method 'lsf'", "hook server_event", "server['score'] is a function", "at task 1 (0-based)", "is kept"]),
    ("step_gradient: a branch on a tensor under vmap", ["run", "{cfg}", "--plugin", "{tmp}/step_branch.py", "--set",
                                                        "method.name=sbr", "--out", "{tmp}/sbr"], 2,
     ["method 'sbr'", "hook step_gradient raised RuntimeError", "vmap",
      "round_terms, loss, step_gradient and carry_step"]),
    ("client_start's steps: 0", ["run", "{cfg}", "--plugin", "{tmp}/steps_zero.py", "--set", "method.name=sz",
                                  "--out", "{tmp}/sz"], 2,
     ["method 'sz'", "hook client_start", "must give as steps None or an int >= 1", "got int 0"]),
    ("round_terms preconditioner: wrong size", ["run", "{cfg}", "--plugin", "{tmp}/preconditioner_shape.py",
                                                          "--set", "method.name=pc", "--out", "{tmp}/pc"], 2,
     ["method 'pc'", "hook round_terms", "must give as preconditioner", "(d = 64)", "shape (3, 3)"]),
    ("step_gradient: integer gradients", ["run", "{cfg}", "--plugin", "{tmp}/step_integer.py", "--set",
                                          "method.name=sint", "--out", "{tmp}/sint"], 2,
     ["method 'sint'", "hook step_gradient", "float tensor shaped like it", "got a torch.int64 tensor"]),
    ("transform_update: an integer update", ["run", "{cfg}", "--plugin", "{tmp}/update_integer.py", "--set",
                                             "method.name=uint", "--out", "{tmp}/uint"], 2,
     ["method 'uint'", "hook transform_update", "float tensor shaped like it", "got a torch.int64 tensor"]),
    ("step_gradient: writes into step.params", ["run", "{cfg}", "--plugin", "{tmp}/step_writes.py", "--set",
                                                "method.name=sw", "--out", "{tmp}/sw"], 2,
     ["method 'sw'", "hook step_gradient", "must not write into its arguments in place",
      "it wrote into step.params['body.1.weight']"]),
    ("server_event(round): scales global_params in place", ["run", "{cfg}", "--plugin", "{tmp}/server_writes.py",
                                                          "--set", "method.name=aw", "--out", "{tmp}/aw"], 2,
     ["method 'aw'", "hook server_event", "must not write into its arguments in place",
      "it wrote into global_params['body.1.weight']"]),
    ("mid-run: step_gradient makes NaN", ["run", "{cfg}", "--plugin", "{tmp}/step_nan.py", "--set", "method.name=sn",
                                          "--out", "{tmp}/sn"], 3,
     ["method 'sn'", "hook step_gradient: made non-finite values (NaN or inf) from finite arguments",
      "['body.1.weight']", "at task 1 (0-based), round 1 of the task", "is kept"]),
    ("mid-run: a task_start key changed during its task", ["run", "{cfg}", "--plugin", "{tmp}/task_start_changed.py",
                                                           "--set", "method.name=tc", "--out", "{tmp}/tc"], 3,
     ["method 'tc'", "pool listed under broadcast['task_start'] changed in a round", "change these keys only at",
      "at task 0 (0-based), round 2 of the task", "is kept"]),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plugins") / "work"  # its parent shows any path escaping the working directory
    tmp.mkdir()
    for name, text in PLUGINS.items():
        (tmp / f"{name}.py").write_text(text)
    (tmp / "cfl_test_exit_benchmark.py").write_text(BENCHMARK)
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (tmp / "sweep.yaml").write_text(yaml.safe_dump({"base": "tiny.yaml", "grid": {"lr": [0.05, 0.1]},
                                                    "out": str(tmp / "swept")}))
    return {"tmp": str(tmp), "cfg": str(tmp / "tiny.yaml"), "sweep": str(tmp / "sweep.yaml")}


def tree(top: Path) -> set[Path]:
    return set(top.rglob("*"))


def test_the_table_covers_each_command_and_outcome():
    assert {c[1][0] for c in CASES} == {"run", "list", "sweep"} and {c[2] for c in CASES} == {2, 3}
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plugin_refusal_or_stop(argv, code, words, files):
    tmp = Path(files["tmp"])
    before = tree(tmp.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp)])}
    env.pop("CFL_TRACEBACK", None)
    proc = subprocess.run([sys.executable, "-m", "cfl", *[a.format(**files) for a in argv],
                           *(["--quiet"] if argv[0] == "run" else [])],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word.format(**files) in proc.stderr, proc.stderr
    new = tree(tmp.parent) - before
    if code == 2:  # nothing written anywhere
        assert not new, sorted(new)
    else:  # only the run directory, its round-0 and task-end checkpoints kept
        out = Path(argv[argv.index("--out") + 1].format(**files))
        assert {p.relative_to(out).parts[0] for p in new if p != out} <= {"checkpoint.pt", "config.yaml",
                                                                       "metrics.jsonl", ".cfl.lock", ".cfl-run"}
        assert (out / "checkpoint.pt").is_file() and not (out / "results.json").exists()


def test_a_traceback_is_shown_on_request(files):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CFL_TRACEBACK": "1"}
    proc = subprocess.run([sys.executable, "-m", "cfl", "list", "--plugin", f"{files['tmp']}/raises.py"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "RuntimeError: boom at import" in proc.stderr
