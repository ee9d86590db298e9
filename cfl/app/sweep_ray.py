"""``cfl sweep --backend ray``: every incomplete combination of a sweep as one Ray task (one run directory each).

Ray schedules the tasks on a local instance (started here, no dashboard) or on an existing cluster
(``--address``), each with ``cpus_per_run`` CPUs (its torch threads) and ``gpus_per_run`` GPUs, so as many
runs go at once as the resources allow. Complete runs are skipped, so a sweep resumes; a progress line is
printed as each run finishes, in the order they finish. See ``docs/scaling.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.app.sweep import SweepRun, pending_runs, run_job
from cfl.config.keys import Config
from cfl.config.schema import ConfigError
from cfl.plugin_files import PluginSource
from cfl.ray_support import init_ray, require_ray


@dataclass(frozen=True)
class RayResources:
    """Where and with what each run of a sweep goes."""

    address: str | None = None  # an existing cluster; None: start a local instance
    num_cpus: int | None = None  # CPUs of a local instance (None: all of this machine's)
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0


def run_one(config: Config, out: str, cwd: str, threads: int, base: Config | None = None,
            plugins: tuple[PluginSource, ...] = ()) -> dict[str, Any] | str:
    """One sweep run on a Ray worker (:func:`cfl.app.sweep.run_job` into ``out``): its headline numbers, or
    why it failed."""
    import torch

    if Path(cwd).is_dir():  # relative paths in configs (data_root) mean what they meant on the driver
        os.chdir(cwd)
    torch.set_num_threads(config.threads or threads)
    outcome = run_job(config, Path(out), base=base, plugins=plugins)  # the plugin files' texts travel here
    return outcome if isinstance(outcome, str) else {k: outcome[k] for k in ("acc", "fgt", "wall_seconds")}


def _check_resources(ray: Any, res: RayResources) -> None:
    """Refuse a per-run request no node of the cluster can ever meet (Ray would wait for it forever)."""
    total = ray.cluster_resources()
    for kind, asked, flag in (("CPU", res.cpus_per_run, "--cpus-per-run"), ("GPU", res.gpus_per_run, "--gpus-per-run")):
        if asked > total.get(kind, 0):
            raise ConfigError(f"{flag} {asked:g} but the Ray cluster has {total.get(kind, 0):g} {kind}(s) in all; "
                              f"lower {flag}" + (" or pass --num-cpus" if kind == "CPU" else ""))


def run_ray(runs: list[SweepRun], res: RayResources,
            plugins: list[PluginSource] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Run every incomplete combination as a Ray task; the finished runs' numbers and the failed runs' names.
    ``plugins``: the ``--plugin`` files (name and text), imported on each worker before its run."""
    ray = require_ray("'cfl sweep --backend ray'")
    todo = [run for _, run in pending_runs(runs)]
    if not todo:
        return [], []
    started = init_ray(ray, res.address, res.num_cpus)
    try:
        _check_resources(ray, res)
        task = ray.remote(run_one).options(num_cpus=res.cpus_per_run, num_gpus=res.gpus_per_run, max_retries=0)
        threads = max(1, int(res.cpus_per_run))
        pending = {task.remote(run.config, str(run.out.resolve()), os.getcwd(), threads, run.base,
                               tuple(plugins or ())): run for run in todo}
        print(f"sweep: {len(todo)} runs as Ray tasks ({res.cpus_per_run:g} CPU, {res.gpus_per_run:g} GPU each; "
              f"cluster: {ray.cluster_resources().get('CPU', 0):g} CPUs)", flush=True)
        finished, failed = [], []
        while pending:
            try:
                [ref], _ = ray.wait(list(pending), num_returns=1)
            except KeyboardInterrupt:  # stop the runs still going (they start over when the sweep is resumed)
                for left in pending:
                    ray.cancel(left, force=True)
                raise
            run = pending.pop(ref)
            done = len(todo) - len(pending)
            try:
                r = ray.get(ref)
            except Exception as err:  # a worker that died: reported, the other runs go on
                r = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            if isinstance(r, str):
                failed.append(run.name)
                print(f"[{done}/{len(todo)} done] {run.name}: FAILED: {r}", flush=True)
                continue
            finished.append(r)
            print(f"[{done}/{len(todo)} done] {run.name}: ACC {r['acc']:.2f}  FGT {r['fgt']:.2f}  "
                  f"({r['wall_seconds']:.0f}s)", flush=True)
        return finished, failed
    finally:
        if started:
            ray.shutdown()
