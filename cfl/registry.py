"""One registry type for every named choice of a config: streams, models, partitioners, methods, aggregators
and losses. Each maps names to entries, with a one-line description per name (what ``cfl list`` prints)."""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar, overload

from cfl.config.schema import ConfigError
from cfl.redefinition import Definition, definition_of, warn_replaced

T = TypeVar("T")

#: what every registered name may be (streams, models, partitioners, methods, aggregators, losses): names go
#: into run directory names (``runs/<stream>-<method>-<partition>-s<seed>``), so no path separator, no ``..``
#: and no leading dot, and short enough for a file name
NAME_MAX_LENGTH = 100
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def name_error(kind: str, name: object) -> str | None:
    """Why ``name`` cannot name a ``kind`` (None: it can)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        return (f"{kind} name {name!r} must be letters, digits, '-', '_' or '.' (starting with a letter or digit, "
                f"no '..'), e.g. 'my-{kind}': names become parts of run directory names")
    if len(name) > NAME_MAX_LENGTH:
        return f"{kind} name '{name[:20]}...' has {len(name)} characters; at most {NAME_MAX_LENGTH} are allowed"
    return None


class UnknownName(ConfigError, KeyError):
    """A name that no entry is registered under: a :class:`ConfigError` (exit code 2) and a ``KeyError``."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class _Missing:
    """No entry given: :meth:`Registry.register` then returns a decorator."""


_MISSING = _Missing()


#: every registry made (streams, models, ..., and the tests' own): what :func:`unchanged_on_error` restores
_EVERY: weakref.WeakValueDictionary[int, Registry] = weakref.WeakValueDictionary()  # id -> registry


@contextmanager
def unchanged_on_error() -> Iterator[None]:
    """If the block raises, every registry holds exactly what it held on entry (a plugin file that fails
    half-way through its import leaves none of its registrations behind)."""
    saved = [(registry, dict(registry._entries)) for registry in list(_EVERY.values())]
    try:
        yield
    except BaseException:
        for registry, entries in saved:
            registry._entries.clear()
            registry._entries.update(entries)
        raise


class Registry(Mapping[str, T], Generic[T]):
    """Names -> entries of one kind, in registration order.

    Read it as a mapping (``REG[name]``, ``name in REG``, iteration, ``REG.items()``); change it only
    through :meth:`register`, :meth:`unregister` and the context managers :meth:`temporarily` and
    :meth:`preserved`, which restore it on exit (tests, notebooks, one run given a built stream).
    Each entry keeps its definition (:func:`cfl.redefinition.definition_of`): registering the same
    definition again replaces the entry with a warning; another one under a taken name is refused.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "stream", "model", ...: named in errors
        self._entries: dict[str, tuple[T, str, Definition | None]] = {}  # name -> (entry, about, definition)
        _EVERY[id(self)] = self

    # ---- reading ----
    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries[name][0]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    def names(self) -> list[str]:
        return list(self._entries)

    def about(self, name: str) -> str:
        """The one-line description given when ``name`` was registered."""
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries[name][1]

    def unknown(self, name: object, key: str | None = None, *, also: tuple[str, ...] = ()) -> UnknownName:
        """The error for a name that is not registered, naming the config ``key`` it came from (if any) and
        every name it could be (``also``: accepted names that are not entries, such as ``auto``)."""
        given = f"{key}: {name}" if key else name
        return UnknownName(f"unknown {self.kind} '{given}'; available: {', '.join([*also, *self._entries])}")

    # ---- changing ----
    @overload
    def register(self, name: str, entry: _Missing = ..., *, about: str = "", replace: bool = False,
                 defined_by: object = None) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T, *, about: str = "", replace: bool = False,
                 defined_by: object = None) -> T: ...

    def register(self, name: str, entry: T | _Missing = _MISSING, *, about: str = "", replace: bool = False,
                 defined_by: object = None) -> T | Callable[[T], T]:
        """Add ``entry`` under ``name`` and return it; without ``entry``, a decorator that registers what it
        decorates. A name already registered is refused (:meth:`refuse_taken`) unless ``replace=True`` or the
        entry has the same definition as the registered one (same module, qualified name and module file:
        a re-run notebook cell, an edited plugin file imported again), which replaces it with a
        :class:`~cfl.redefinition.ReplacedRegistration` warning. ``defined_by``: the class or function that
        defines the entry (default: the entry itself)."""
        if isinstance(entry, _Missing):
            def decorate(obj: T) -> T:
                return self.register(name, obj, about=about, replace=replace, defined_by=defined_by)
            return decorate
        if (why := name_error(self.kind, name)) is not None:
            raise ConfigError(why)
        definition = definition_of(entry if defined_by is None else defined_by)
        if name in self._entries and not replace:
            self.refuse_taken(name, definition)  # returns for the same definition only (never None)
            if definition is not None and entry is not self._entries[name][0]:
                warn_replaced(self.kind, name, definition)
        self._entries[name] = (entry, about, definition)
        return entry

    def refuse_taken(self, name: str, definition: Definition | None) -> None:
        """Raise :class:`ConfigError` if ``name`` is registered by another definition than ``definition``
        (``None``: any entry refuses it)."""
        if name not in self._entries:
            return
        held = self._entries[name][2]
        if definition is not None and definition == held:
            return
        by = (f" (by {held}; {definition} is another definition)" if definition is not None and held is not None
              else f" (by {held})" if held is not None else "")
        rule = (". Only the same class or function defined again (same module, qualified name and file: a re-run "
                "notebook cell, an edited plugin file) replaces an entry") if definition is not None else ""
        raise ConfigError(f"{self.kind} '{name}' is already registered{by}; choose another name (registered: "
                          f"{', '.join(self._entries)}){rule}")

    def unregister(self, name: str) -> None:
        if name not in self._entries:
            raise UnknownName(f"{self.kind} '{name}' is not registered (registered: {', '.join(self._entries)})")
        del self._entries[name]

    @contextmanager
    def temporarily(self, name: str, entry: T, *, about: str = "", replace: bool = False) -> Iterator[T]:
        """:meth:`register` for the ``with`` block only: on exit, error or not, ``name`` is bound again to
        what it was bound to before (or to nothing). A taken name is refused unless ``replace=True``,
        whatever the definitions."""
        previous = self._entries.get(name)
        if not replace:
            self.refuse_taken(name, None)
        self.register(name, entry, about=about, replace=replace)
        try:
            yield entry
        finally:
            if previous is None:
                self._entries.pop(name, None)
            else:
                self._entries[name] = previous

    @contextmanager
    def preserved(self) -> Iterator[Registry[T]]:
        """On exit, error or not, the registry holds exactly what it held on entry (for code that registers
        names not known in advance, such as a plugin file)."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)
