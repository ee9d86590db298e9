"""Ray is an optional extra (``pip install -e ".[ray]"`` in the checkout): import it only where it is used, with a
clear error."""

from __future__ import annotations

from typing import Any

from cfl.config.schema import ConfigError
from cfl.distribution import extra_install

INSTALL_HINT = extra_install("ray")


def require_ray(what: str) -> Any:
    """The ``ray`` module, or a :class:`ConfigError` naming ``what`` asked for it and the extra to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{what} needs Ray, which is not installed; install the optional extra with: "
                          f"{INSTALL_HINT} (or pip install 'ray>=2.9'), or use the local backend") from None
    return ray


def init_ray(ray: Any, address: str | None, num_cpus: int | None = None) -> bool:
    """Connect to the cluster at ``address``, else start a local instance (no dashboard, worker logs not
    forwarded); does nothing when Ray is already initialised. True when this call started or joined one."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, **kwargs)
    return True
