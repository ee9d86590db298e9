"""Config and sweep files read as YAML, safely: a key given twice in one mapping, a document that its aliases expand
past a limit, a recursive alias, a file that is not UTF-8 text or not a mapping are each a :class:`ConfigError`
naming the file and the fix; ``--set key=value`` overrides parsed as YAML values and set at their dotted keys."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from cfl.config.schema import ConfigError

__all__ = ["parse_overrides", "parse_yaml", "read_yaml", "set_dotted"]


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``tree``'s value at ``dotted`` (``model.train``), making the sections on the way (``--set``)."""
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: '{k}' is not a section")
        node = child
    node[keys[-1]] = value


#: most values (scalars, lists, mappings) one YAML document may hold once its aliases are expanded: a config or
#: sweep file holds a few hundred, while a 1 KB "billion laughs" file of nested aliases expands to 10**9
YAML_VALUE_LIMIT = 100_000


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def expanded_size(root: yaml.Node, limit: int = YAML_VALUE_LIMIT) -> int | None:
    """The values of a composed YAML document with every alias expanded (counted up to ``limit + 1``; each
    shared node is visited once, so a bomb costs no more than its text), or None for a recursive alias."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the path from the root to the node being counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_counted = stack.pop()
        if children_counted:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(limit + 1, 1 + sum(sizes[id(c)] for c in _children(node)))
        elif id(node) in open_nodes:
            return None
        elif id(node) not in sizes:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
    return sizes[id(root)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently) and a
    document of more than ``YAML_VALUE_LIMIT`` values once its aliases are expanded (or a recursive alias)."""

    def construct_document(self, node: yaml.Node) -> Any:
        size = expanded_size(node)
        if size is None:
            raise ConfigError("a YAML alias (*name) refers to a list or mapping that holds the alias itself; "
                              "write the values out")
        if size > YAML_VALUE_LIMIT:
            raise ConfigError(f"it holds more than {YAML_VALUE_LIMIT:,} values once its YAML aliases (*name) are "
                              f"expanded (the limit of a config; a config holds a few hundred): write it without "
                              f"nested aliases")
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then overriding a key is fine
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                where = f"lines {seen[key]} and {line}" if seen[key] != line else f"line {line}"
                raise ConfigError(f"key '{key}' is given twice in one mapping ({where}); keep one")
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """YAML text to plain data, refusing duplicate keys (:class:`ConfigError` naming key and lines)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """Parse ``key=value`` strings (values read as YAML, so 0.1 is a number and [1,2] a list)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"malformed --set '{item}': expected dotted.key=value, e.g. --set lr=0.05")
        try:
            value = parse_yaml(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({err})") from None
        except ConfigError as err:
            raise ConfigError(f"--set {key}: {err}") from None
        out.append((key.strip(), value))
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory; pass a YAML file such as configs/quickstart.yaml "
                          "(to continue the run in a run directory: cfl run --resume DIR)")
    if not path.is_file():
        state = "does not exist" if not path.exists() else "is not a regular file"
        raise ConfigError(f"config file '{path}' {state}; pass a YAML file such as configs/quickstart.yaml")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file '{path}' is not UTF-8 text ({err.reason} at byte {err.start}); "
                          "pass a YAML file such as configs/quickstart.yaml") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {err}") from None
    except ConfigError as err:
        raise ConfigError(f"config file '{path}': {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys, got {type(data).__name__}")
    return data
