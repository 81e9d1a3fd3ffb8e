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
# Ray resolves a node address of 127.0.0.1 to the machine's routable address (so other machines could
# join) and then binds its servers (GCS, raylet, workers) to every interface. With this switch off (Ray's own
# setting, named for the platforms where it is off by default) the node keeps 127.0.0.1 and every server
# binds to loopback only. Set for the clusters speclab starts (and in `ray start`'s environment: docs).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
_ENABLE_RAY_CLUSTER: dict[int, bool] = {}  # ray's value before a local start switched it off


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
        start_local(ray, local_resources, kw)
        echo(f"ray: no running cluster; started a local one on {LOCAL_HOST} (loopback only)")
    try:
        yield ray
    finally:
        ray.shutdown()
        from ray._private import ray_constants

        if id(ray_constants) in _ENABLE_RAY_CLUSTER:
            ray_constants.ENABLE_RAY_CLUSTER = _ENABLE_RAY_CLUSTER.pop(id(ray_constants))


def start_local(
    ray: Any, resources: dict[str, float] | None = None, kw: dict[str, Any] | None = None
) -> None:
    """A one-node cluster whose servers listen on 127.0.0.1 only (see LOOPBACK_ENV)."""
    from ray._private import ray_constants

    os.environ.update(LOOPBACK_ENV)  # the cluster's own Python processes read it at import
    _ENABLE_RAY_CLUSTER.setdefault(id(ray_constants), ray_constants.ENABLE_RAY_CLUSTER)
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported ray already (restored on exit)
    ray.init(
        num_cpus=os.cpu_count() or 1,
        resources=dict(resources or {}),
        include_dashboard=False,
        _node_ip_address=LOCAL_HOST,
        **(kw or {}),
    )
    where = {n.get("NodeManagerAddress") for n in ray.nodes()}
    if where != {LOCAL_HOST}:  # a Ray that ignores the switch: do not run anything reachable from outside
        ray.shutdown()
        raise ConfigError(
            f"the local Ray cluster came up on {', '.join(map(str, where))}, not {LOCAL_HOST} only; "
            "start one yourself and pass its address to --ray"
        )
