"""The ``cfl`` command: run, list, report, config-reference."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

from cfl.config.schema import ConfigError
from cfl.engine.rounds.stop import RunStopped, StopRequest, signal_exit_code

EXIT_CONFIG = 2
PLUGIN_HELP = ("import a file that registers extra methods or streams (docs/plugins.md, docs/own-dataset.md); "
               "repeatable")


def _cmd_run(args: argparse.Namespace) -> int:
    from cfl.app.single_run import execute, resume_config
    from cfl.plugin_files import load_plugins
    from cfl.report.wandb_sweep import load_with_sweep, refuse_under_sweep, sweep_run_dir

    load_plugins(args.plugin)
    if args.resume:
        clash = [flag for flag, given in (("a config file", args.config), ("--out", args.out),
                                          ("--overwrite", args.overwrite),
                                          ("--trust-callables", args.trust_callables)) if given]
        if clash:
            raise ConfigError(f"--resume {args.resume} continues that run with its own config and directory; "
                              f"drop {' and '.join(clash)}")
        refuse_under_sweep(f"--resume {args.resume}", "a resumed run keeps its config.yaml")
        cfg = resume_config(Path(args.resume), args.set)
        execute(cfg, Path(args.resume), quiet=args.quiet, resume=True)
        return 0
    if args.config is None:
        raise ConfigError("cfl run needs a YAML config file (e.g. configs/quickstart.yaml) or --resume RUN_DIR")
    # under `wandb agent`: the sweep's parameters too
    cfg, source = load_with_sweep(args.config, args.set, args.trust_callables)
    out = Path(args.out) if args.out else sweep_run_dir(cfg)
    execute(cfg, out, overwrite=args.overwrite, quiet=args.quiet, source=source)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from cfl.data.avalanche_route import ROUTE
    from cfl.data.partition import PARTITIONERS
    from cfl.data.stream_registry import STREAMS
    from cfl.methods import METHODS
    from cfl.models import MODELS
    from cfl.ops.aggregate import AGGREGATORS
    from cfl.ops.losses import LOSSES
    from cfl.plugin_files import load_plugins
    from cfl.schedules import SCHEDULES

    load_plugins(args.plugin)

    streams = {k: f"{STREAMS.about(k)} [{v.full_tasks} tasks; {'/'.join(v.scenarios)}]" for k, v in STREAMS.items()}
    streams[ROUTE] = "any Avalanche benchmark: stream.benchmark: dotted.path.to.callable, stream.args: {...} " \
                     "(docs/streams.md)"
    sections = [("streams", streams)] + [
        (title, {k: registry.about(k) for k in registry})
        for title, registry in (("models", MODELS), ("partitioners", PARTITIONERS), ("methods", METHODS),
                                ("aggregators", AGGREGATORS), ("losses", LOSSES), ("schedules", SCHEDULES))]
    for title, rows in sections:
        print(f"{title}:")
        width = max(len(k) for k in rows)
        for name, about in rows.items():
            print(f"  {name:<{width}}  {about}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from cfl.app.sweep import load_sweeps, run_local, run_parallel, write_sweep_figures
    from cfl.plugin_files import load_plugins
    from cfl.report.table import report
    from cfl.report.wandb_sweep import refuse_under_sweep

    refuse_under_sweep("cfl sweep", "it runs its own grid")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1 and args.backend == "ray":
        raise ConfigError("--jobs is for the local backend; with --backend ray use --num-cpus and --cpus-per-run")
    if args.backend == "ray":  # before any config or data is read
        from cfl.ray_support import require_ray

        require_ray("'cfl sweep --backend ray'")
    plugins = load_plugins(args.plugin)  # before the grid's configs are validated; workers import them too
    runs = load_sweeps(args.sweep, args.out)
    roots = sorted({str(r.out.parent) for r in runs})
    print(f"sweep: {len(runs)} runs under {', '.join(r + '/' for r in roots)}", flush=True)
    try:
        if args.backend == "ray":
            from cfl.app.sweep_ray import RayResources, run_ray

            _, failed = run_ray(runs, RayResources(args.address, args.num_cpus, args.cpus_per_run,
                                                   args.gpus_per_run), plugins)
        elif args.jobs > 1:
            _, failed = run_parallel(runs, args.jobs, plugins)
        else:
            _, failed = run_local(runs, quiet=not args.verbose)
    except RunStopped as err:
        if err.exit_code < 128:
            raise
        raise RunStopped(f"{err}\n{_sweep_resume_hint(args)}", err.exit_code) from None
    except KeyboardInterrupt as err:
        code = signal_exit_code(err)
        raise RunStopped(f"stopped by {signal.Signals(code - 128).name}\n{_sweep_resume_hint(args)}", code) from None
    done = [r.out for r in runs if (r.out / "results.json").is_file()]
    if done:  # when every run failed there is no table, only the failures below
        print(report(done))
        write_sweep_figures(runs)
    if failed:
        print(f"cfl: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _names(text: str | None) -> tuple[str, ...] | None:
    """``a,b, c`` as ``('a', 'b', 'c')``; None stays None."""
    return None if text is None else tuple(n.strip() for n in text.split(",") if n.strip())


def _sweep_resume_hint(args: argparse.Namespace) -> str:
    """How to resume a stopped sweep: the same command again (its plugins, backend and --out included)."""
    return (f"cfl: resume the sweep with the same command: {shlex.join(['cfl', *args.argv])} (complete runs are "
            "skipped; a run cut off with a checkpoint resumes from it)")



def _cmd_report(args: argparse.Namespace) -> int:
    from cfl.report.table import TableOptions, report

    options = TableOptions(_names(args.columns), _names(args.order), args.caption, args.label, args.reference,
                           args.test, args.last_k, args.layout, args.width)
    options.check(args.format)  # refuse bad options before any work
    styled = (args.plot_style or args.plot_format or args.y_range or args.figure_size or args.facet
              or args.title is not None)
    if styled and not args.plots:
        raise ConfigError("--plot-style, --plot-format, --y-range, --figure-size, --facet and --title shape the "
                          "figures of --plots DIR; add --plots DIR")
    if args.plots:  # refuse a bad directory or figure option before any work
        from cfl.report.compare_plots import check_out_dir, write_figures
        from cfl.report.figure_style import FigureOptions, read_style

        check_out_dir(Path(args.plots))
        figures = read_style(args.plot_style) if args.plot_style else FigureOptions()
        figures = figures.with_cli(args.plot_format, args.y_range, args.figure_size)
        figures = figures.with_report(options.order, args.facet, args.title, args.last_k)
    print(report(args.runs, args.format, options))
    failed: list[str] = []
    if args.plots:
        write_figures(args.runs, Path(args.plots), figures, failed)
    if failed:  # the table, every CSV and the other figures are written
        print(f"cfl: {len(failed)} figure(s) could not be drawn: {', '.join(failed)} (see the warnings above)",
              file=sys.stderr)
        return 1
    return 0


def config_reference(plugin_methods: dict[str, str] | None = None) -> str:
    """The configuration reference (docs/configuration.md): every key, type, default and meaning;
    ``plugin_methods`` (method name -> the ``--plugin`` file that registered it) are marked as such."""
    from cfl.config.keys import Config
    from cfl.config.schema import describe
    from cfl.methods import METHODS

    plugin_methods = plugin_methods or {}
    lines = ["# Configuration reference", "",
             "Generated by `cfl config-reference`; `tests/project/test_docs.py` checks this page is up to date.", "",
             "A key read only under some choices (e.g. `partition.alpha`: dirichlet only) is refused when set away "
             "from its default under another (docs/reliability.md, Refusals).", "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {tp} | `{default}` | {doc} |" for key, tp, default, doc in describe(Config)]
    lines += ["", "## Method parameters", "",
              "Set next to the name: `method: {name: fedprox, mu: 0.01}` (or in a `plugins` entry).", ""]
    for name, cls in METHODS.items():
        rows = describe(cls.Hyperparams)
        origin = f" (from --plugin {plugin_methods[name]})" if name in plugin_methods else ""
        lines += [f"### `{name}`{origin}", "", cls.about, ""]
        if rows:
            lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
            lines += [f"| `method.{key}` | {tp} | `{default}` | {doc} |" for key, tp, default, doc in rows]
        else:
            lines.append("No parameters.")
        lines.append("")
    return "\n".join(lines)


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from cfl.methods import METHODS
    from cfl.plugin_files import load_plugins

    plugin_methods: dict[str, str] = {}
    for path in args.plugin:  # one file at a time: each new method is named with the file that registered it
        before = set(METHODS)
        load_plugins([path])
        plugin_methods.update({name: path for name in METHODS if name not in before})
    print(config_reference(plugin_methods), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cfl", description="Continual federated learning benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment from a YAML config")
    run.add_argument("config", nargs="?", help="YAML config file, e.g. configs/quickstart.yaml")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue an interrupted run from its last checkpoint (see docs/reliability.md)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key (dotted, repeatable): --set method.name=fedprox")
    run.add_argument("--out", help="run directory (default: runs/<stream>-<method>-<partition>-s<seed>)")
    run.add_argument("--overwrite", action="store_true", help="replace the outputs of an existing run directory")
    run.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help=PLUGIN_HELP)
    run.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    run.add_argument("--trust-callables", action="store_true",
                     help="under a W&B sweep: let its parameters name any stream.benchmark callable (a config is "
                          "code; by default only avalanche.benchmarks.* and --plugin files; docs/streams.md)")
    run.set_defaults(func=_cmd_run)
    swp = sub.add_parser("sweep", help="run every combination of a base config and a grid (see cfl/app/sweep.py)")
    swp.add_argument("sweep", nargs="+", help="sweep YAML(s): base, grid, optional set and out")
    swp.add_argument("--out", help="directory for the run directories (default: the sweep's out; one sweep only)")
    swp.add_argument("--jobs", type=int, default=1,
                     help="local backend: runs at a time, each in its own process (default 1: one after another)")
    swp.add_argument("--verbose", action="store_true", help="progress bars for each run")
    swp.add_argument("--backend", choices=("local", "ray"), default="local",
                     help="local: one run after another here; ray: each run a Ray task (see docs/scaling.md)")
    swp.add_argument("--address", help="--backend ray: address of an existing Ray cluster (default: a local one)")
    swp.add_argument("--num-cpus", type=int, help="--backend ray: CPUs of the local Ray instance (default: all)")
    swp.add_argument("--cpus-per-run", type=float, default=1.0, help="--backend ray: CPUs per run (default 1)")
    swp.add_argument("--gpus-per-run", type=float, default=0.0, help="--backend ray: GPUs per run (default 0)")
    swp.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help=PLUGIN_HELP)
    swp.set_defaults(func=_cmd_sweep)
    lst = sub.add_parser("list", help="list streams, models, partitioners, methods, aggregators and losses")
    lst.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help=PLUGIN_HELP)
    lst.set_defaults(func=_cmd_list)
    rep = sub.add_parser("report", help="table of ACC/FGT/AIA/FWT (mean ± std over seeds), one row per config "
                                        "(runs equal but for seed and result-neutral keys)")
    rep.add_argument("runs", nargs="+", help="run directories (searched recursively for results.json)")
    rep.add_argument("--format", choices=("md", "csv", "latex"), default="md",
                     help="md (Markdown, default), csv (mean, std and n columns) or latex (a booktabs tabular, the "
                          "best value per column in bold)")
    rep.add_argument("--columns", metavar="KEY,...",
                     help="the columns, in order, from: stream, partition, method, runs, seeds, acc, fgt, bwt, aia, "
                          "fwt, client_acc, client_fgt, targets, class_acc, rounds, upload, wall (default: all but "
                          "bwt, class_acc and rounds; aia, fwt and the client means under a schedule when measured)")
    rep.add_argument("--order", metavar="NAME,...",
                     help="rows to list first, in this order, within each stream and partition, each named by "
                          "its method, its label as the table or a legend shows it, or its config label (any case; "
                          "default: fedavg first when present)")
    rep.add_argument("--caption", metavar="TEXT", help="--format latex: a table float with this caption (LaTeX)")
    rep.add_argument("--label", metavar="KEY", help="--format latex: a table float with this \\label")
    rep.add_argument("--reference", metavar="LABEL",
                     help="the row each row is tested against, paired by seed, in each stream and partition (a method "
                          "or a whole row label; default: fedavg where a block has one FedAvg row); cells that differ "
                          "at p < 0.05 get a dagger, the CSV the p-values (cfl/report/significance.py)")
    rep.add_argument("--test", choices=("t", "wilcoxon"), default="t",
                     help="the paired test: t (scipy.stats.ttest_rel, 2 seeds or more; default) or wilcoxon "
                          "(scipy.stats.wilcoxon, 6 seeds or more)")
    rep.add_argument("--last-k", type=int, metavar="K",
                     help="ACC as the mean of each run's last K evaluations (metrics.jsonl mean_acc), in the table "
                          "and, as a trailing mean over K evaluations, in the accuracy curves (cfl/report/last_k.py)")
    rep.add_argument("--layout", choices=("rows", "methods-x-settings"), default="rows",
                     help="--format latex: one row per group (default) or one row per method with a \\multicolumn "
                          "group of columns per setting (stream and partition)")
    rep.add_argument("--width", metavar="LENGTH",
                     help="--format latex: scale the tabular to this LaTeX length, e.g. '\\linewidth' "
                          "(\\resizebox; needs \\usepackage{graphicx})")
    rep.add_argument("--facet", choices=("auto", "none", "stream", "partition"),
                     help="figures: a panel per setting; auto (default): per stream (with its scenario) and partition "
                          "where the groups differ in them; none: one panel, every group its own look")
    rep.add_argument("--title", nargs="?", const="", metavar="TEXT",
                     help="figures: a title (TEXT, or without it the caption of the sidecar NAME.txt); default: none")
    rep.add_argument("--plots", metavar="DIR", help="also write comparison figures (PNG) and their data (CSV) to "
                     "DIR: ACC and FGT per group, ACC against FGT, accuracy over rounds, final accuracy matrices")
    rep.add_argument("--plot-style", metavar="FILE.yaml", help="figure options: which groups in which order, their "
                     "legend texts and colours, y range, size, formats (cfl/report/figure_style.py, docs/results.md)")
    rep.add_argument("--plot-format", action="append", metavar="pdf|svg",
                     help="also save each figure as PDF or SVG beside its PNG (repeatable, or comma-separated)")
    rep.add_argument("--y-range", nargs="+", metavar="LOW HIGH", help="accuracy axes from LOW to HIGH, or 'full' "
                     "(0-100 with a margin); default: fitted to the data")
    rep.add_argument("--figure-size", nargs=2, metavar=("WIDTH", "HEIGHT"), help="each figure's size in inches")
    rep.set_defaults(func=_cmd_report)
    ref = sub.add_parser("config-reference", help="print every config key with its type, default and meaning")
    ref.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                     help=PLUGIN_HELP + "; their methods' parameters are listed too")
    ref.set_defaults(func=_cmd_config_reference)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with StopRequest().installed():  # a signal before a run has started stops at once, with a message
            return args.func(args)
    except ConfigError as err:
        print(f"cfl: config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except FileNotFoundError as err:
        print(f"cfl: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except RunStopped as stop:
        print(f"cfl: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt as err:
        code = signal_exit_code(err)
        print(f"cfl: stopped by {signal.Signals(code - 128).name}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
