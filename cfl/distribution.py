"""The distribution's name and the install line of an optional extra.

The package imports as ``cfl`` and installs the ``cfl`` command, but its distribution (what pip installs and
``python -m build`` names) is ``cfl-bench``: the name ``cfl`` on PyPI is another project (Causal Feature
Learning), which an install line naming ``cfl`` would install. cfl-bench is not published on PyPI: it is installed
from a checkout, so an extra's install line is the checkout's editable one."""

from __future__ import annotations

DISTRIBUTION = "cfl-bench"
#: the project on PyPI under the import name, which an install line must never name
TAKEN_NAME = "cfl"


def extra_install(extra: str) -> str:
    """The command that installs the optional ``extra`` (``ray``, ``pretrained``) into a checkout's environment."""
    return f"pip install -e \".[{extra}]\" in the {DISTRIBUTION} checkout"
