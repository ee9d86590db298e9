"""``--plugin FILE.py``: import a user's file whose ``register`` calls add methods or streams (docs/plugins.md,
docs/own-dataset.md). Sweep worker processes and Ray workers import the same files' texts again."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from types import ModuleType

from cfl.config.schema import ConfigError
from cfl.failures import USER_FAILURES, line_in, one_line, show_traceback
from cfl.registry import unchanged_on_error

#: (file name, source) of the plugin files imported in this process -> its module: each text imported once, and
#: only the last text of a file kept (an edited file is imported again, and so is the earlier text after it)
LOADED: dict[tuple[str, str], ModuleType] = {}

PluginSource = tuple[str, str]  # (file name, its text): what travels to worker processes and Ray workers


def load_plugins(paths: list[str] | tuple[str, ...]) -> list[PluginSource]:
    """Import each plugin file (once per process); their names and texts, to import them in workers."""
    sources = [_read(Path(path)) for path in paths]
    load_sources(sources)
    return sources


def _read(file: Path) -> PluginSource:
    if file.is_dir():
        raise ConfigError(f"plugin file '{file}' is a directory, not a Python file; name the FILE.py in it")
    if not file.is_file():
        raise ConfigError(f"plugin file '{file}' does not exist")
    if file.suffix != ".py":
        raise ConfigError(f"plugin file '{file}' is not a Python file (name it FILE.py)")
    try:
        return str(file), file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"plugin file '{file}' is not valid Python: it is not UTF-8 text") from None


def resume_command(run_dir: Path | str) -> str:
    """``cfl run --resume RUN_DIR``, with a ``--plugin`` for each plugin file imported in this process (a run
    that uses a plugin's method or stream cannot resume without it)."""
    files = list(dict.fromkeys(file for file, _ in LOADED))
    return shlex.join(["cfl", "run", "--resume", str(run_dir), *(a for f in files for a in ("--plugin", f))])


def load_sources(sources: list[PluginSource]) -> None:
    """Import plugin files from their texts (in a worker: the files need not exist there)."""
    for file, text in sources:
        if (file, text) in LOADED:
            continue
        module = _exec(file, text)  # an edited file: its classes replace their earlier selves (cfl.redefinition)
        for earlier in [key for key in LOADED if key[0] == file]:
            del LOADED[earlier]
        LOADED[file, text] = module


def _exec(file: str, text: str) -> ModuleType:
    name = f"cfl_plugin_{Path(file).stem}"
    module = ModuleType(name)
    module.__file__ = file
    earlier = sys.modules.get(name)  # the same file's earlier text (Python API): kept if this one fails
    sys.modules[name] = module
    try:
        with unchanged_on_error():  # a file that fails registers nothing (the earlier text's entries stay)
            exec(compile(text, file, "exec"), module.__dict__)  # noqa: S102 -- the user's own plugin file
    except SyntaxError as err:  # also NUL bytes
        _restore(name, earlier)
        where = f" at line {err.lineno}" if err.lineno else ""
        raise ConfigError(f"plugin file '{file}' is not valid Python{where}: {err.msg}") from None
    except USER_FAILURES as err:  # anything the file's own code raises, sys.exit too: a refusal naming it
        _restore(name, earlier)
        raise import_failure(file, err) from None
    except BaseException:  # Ctrl-C, SIGTERM
        _restore(name, earlier)
        raise
    return module


def _restore(name: str, earlier: ModuleType | None) -> None:
    if earlier is None:
        sys.modules.pop(name, None)
    else:
        sys.modules[name] = earlier


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
