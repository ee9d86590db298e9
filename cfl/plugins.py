"""``--plugin FILE.py``: import a user's file whose ``register`` calls add methods or streams (docs/plugins.md,
docs/own-dataset.md). Sweep worker processes and Ray workers import the same files' texts again."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from cfl.failures import USER_FAILURES, line_in, one_line, show_traceback
from cfl.schema import ConfigError

#: (file name, source) of every plugin file imported in this process -> its module (each imported once)
LOADED: dict[tuple[str, str], ModuleType] = {}

PluginSource = tuple[str, str]  # (file name, its text): what travels to worker processes and Ray workers


def load_plugins(paths: list[str] | tuple[str, ...]) -> list[PluginSource]:
    """Import each plugin file (once per process); their names and texts, to import them in workers."""
    sources = [_read(Path(path)) for path in paths]
    load_sources(sources)
    return sources


def _read(file: Path) -> PluginSource:
    if not file.is_file():
        raise ConfigError(f"plugin file '{file}' does not exist")
    if file.suffix != ".py":
        raise ConfigError(f"plugin file '{file}' is not a Python file (name it FILE.py)")
    try:
        return str(file), file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"plugin file '{file}' is not valid Python: it is not UTF-8 text") from None


def load_sources(sources: list[PluginSource]) -> None:
    """Import plugin files from their texts (in a worker: the files need not exist there)."""
    for file, text in sources:
        if (file, text) not in LOADED:
            LOADED[file, text] = _exec(file, text)


def _exec(file: str, text: str) -> ModuleType:
    name = f"cfl_plugin_{Path(file).stem}"
    module = ModuleType(name)
    module.__file__ = file
    sys.modules[name] = module
    try:
        exec(compile(text, file, "exec"), module.__dict__)  # noqa: S102 -- the user's own plugin file
    except SyntaxError as err:  # also NUL bytes
        del sys.modules[name]
        where = f" at line {err.lineno}" if err.lineno else ""
        raise ConfigError(f"plugin file '{file}' is not valid Python{where}: {err.msg}") from None
    except USER_FAILURES as err:  # anything the file's own code raises, sys.exit too: a refusal naming it
        del sys.modules[name]
        raise import_failure(file, err) from None
    except BaseException:  # Ctrl-C, SIGTERM
        del sys.modules[name]
        raise
    return module


def import_failure(file: str, err: BaseException) -> ConfigError:
    """The refusal of a plugin file whose import raised ``err`` (or called ``sys.exit``)."""
    show_traceback(err)
    line = line_in(err, file)
    where = f" at line {line}" if line else ""
    if isinstance(err, ConfigError):  # a registration cfl refused (a bad or taken name, a bad stream)
        return ConfigError(f"plugin file '{file}'{where}: {err}")
    hint = ("; install the missing module or fix the import" if isinstance(err, ImportError) else
            "; a plugin file may only define and register (docs/plugins.md)" if isinstance(err, SystemExit) else "")
    return ConfigError(f"plugin file '{file}' failed while being imported{where}: {one_line(err)}{hint} "
                       "(CFL_TRACEBACK=1 shows the traceback)")


def ship_to_ray(ray: ModuleType) -> None:
    """Ray workers cannot import a plugin file by its module name: have Ray pickle the plugin modules'
    classes by value (``backend: ray`` sends the method objects to its workers)."""
    for module in LOADED.values():
        ray.cloudpickle.register_pickle_by_value(module)
