"""The ``cfl`` command: run, list, report, config-reference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cfl.schema import ConfigError

EXIT_CONFIG = 2


def _cmd_run(args: argparse.Namespace) -> int:
    from cfl.config import load_config
    from cfl.run import execute

    load_plugins(args.plugin)
    cfg = load_config(args.config, args.set)
    execute(cfg, Path(args.out) if args.out else None, overwrite=args.overwrite, quiet=args.quiet)
    return 0


def load_plugins(paths: list[str]) -> None:
    """Import user plugin files; their ``@register`` lines add methods to the registry."""
    import importlib.util

    for path in paths:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"plugin file '{file}' does not exist")
        spec = importlib.util.spec_from_file_location(f"cfl_plugin_{file.stem}", file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def _cmd_list(_args: argparse.Namespace) -> int:
    from cfl.data.partition import PARTITIONERS
    from cfl.data.streams import STREAMS
    from cfl.methods import METHODS
    from cfl.models import MODELS

    sections = [
        ("streams", {k: f"{v.about} [{v.full_tasks} tasks; {'/'.join(v.scenarios)}]" for k, v in STREAMS.items()}),
        ("models", {k: v[1] for k, v in MODELS.items()}),
        ("partitioners", {k: v[1] for k, v in PARTITIONERS.items()}),
        ("methods", {k: v.about for k, v in METHODS.items()}),
    ]
    for title, rows in sections:
        print(f"{title}:")
        width = max(len(k) for k in rows)
        for name, about in rows.items():
            print(f"  {name:<{width}}  {about}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from cfl.report.table import report

    print(report(args.runs))
    return 0


def _cmd_config_reference(_args: argparse.Namespace) -> int:
    from cfl.config import Config
    from cfl.schema import describe

    print("| key | type | default | meaning |\n|---|---|---|---|")
    for key, tp, default, doc in describe(Config):
        print(f"| `{key}` | {tp} | `{default}` | {doc} |")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cfl", description="Continual federated learning benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment from a YAML config")
    run.add_argument("config", help="YAML config file, e.g. configs/quickstart.yaml")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key (dotted, repeatable): --set method.name=fedprox")
    run.add_argument("--out", help="run directory (default: runs/<stream>-<method>-<partition>-s<seed>)")
    run.add_argument("--overwrite", action="store_true", help="replace the outputs of an existing run directory")
    run.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                     help="import a file that registers extra methods (see docs/plugins.md); repeatable")
    run.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    run.set_defaults(func=_cmd_run)
    lst = sub.add_parser("list", help="list streams, models, partitioners and methods")
    lst.set_defaults(func=_cmd_list)
    rep = sub.add_parser("report", help="Markdown table of ACC/FGT (mean ± std over seeds) of run directories")
    rep.add_argument("runs", nargs="+", help="run directories (searched recursively for results.json)")
    rep.set_defaults(func=_cmd_report)
    ref = sub.add_parser("config-reference", help="print every config key with its type, default and meaning")
    ref.set_defaults(func=_cmd_config_reference)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"cfl: config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except FileNotFoundError as err:
        print(f"cfl: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("cfl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
