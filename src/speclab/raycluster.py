"""Ray, where installed (the `ray` extra): connect to a cluster, or start a local one on loopback.

Used by `speclab bench --ray` (bench/raybench.py) and `speclab simulate --ray` (simulate/distributed.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from speclab.errors import ConfigError

LOCAL_HOST = "127.0.0.1"


def import_ray() -> Any:
    """The ray module, or one clear error line when the extra is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray, which is not installed: pip install 'speclab[ray]' (or run scripts/setup.sh)"
        ) from None
    return ray


@contextlib.contextmanager
def ray_cluster(
    address: str, local_resources: dict[str, float] | None = None, echo: Any = print
) -> Iterator[Any]:
    """Connect to the Ray cluster at `address` and yield the ray module; disconnect afterwards.

    "auto": the running cluster (RAY_ADDRESS, or one started on this machine with `ray start`); where there
    is none, and always for "local": a new local one on 127.0.0.1 with this machine's CPUs and
    `local_resources`, stopped on exit.
    Already connected (a caller's own ray.init): that connection is used and left open."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine
    kw: dict[str, Any] = {"log_to_driver": False, "logging_level": "WARNING"}
    try:
        if address == "local":
            raise ConnectionError
        ray.init(address=address, **kw)
        echo(f"ray: connected to the cluster at {address}")
    except ConnectionError:
        if address not in ("auto", "local"):
            raise ConfigError(f"--ray {address}: no Ray cluster answers there") from None
        ray.init(
            num_cpus=os.cpu_count() or 1,
            resources=dict(local_resources or {}),
            include_dashboard=False,
            _node_ip_address=LOCAL_HOST,
            **kw,
        )
        echo(f"ray: no running cluster; started a local one on {LOCAL_HOST}")
    try:
        yield ray
    finally:
        ray.shutdown()
