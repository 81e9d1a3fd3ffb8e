"""A simulation sweep (policies x batch sizes x trace sets) split into independent tasks, run one after the
other here or as Ray tasks (`speclab simulate --ray`, `simulate_sweep(..., ray_address=...)`).

One task = one trace set x one batch size (all policies), or with by_policy=True one trace set x one policy
x one batch size: `simulate()` on exactly that, so its rows are the rows a single `simulate()` call over the
whole sweep gives (each policy is simulated against its own baseline, the study's sampling and miss draws
are seeded per policy and batch size; tests check equality). The price of splitting by policy is that every
task simulates its own no-SD baseline, which one call shares between its policies; and every task reads its
whole trace set. With lengths="common" every policy runs over the lengths of all the sweep's methods, so a
task then keeps all policies together whatever by_policy says.

Each trace set goes to the Ray object store once (`ray.put`) and every task of that set reads it from there;
the traces need no shared filesystem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speclab.costmodel import CostModel
from speclab.simulate.api import SimResult, check_args, simulate
from speclab.traces.model import RequestTrace


@dataclass(frozen=True)
class SimTask:
    trace_set: str
    policies: tuple[str, ...]
    batch_size: int


def plan(
    trace_sets: list[str],
    policies: list[str],
    batch_sizes: list[int],
    opts: dict[str, Any],
    by_policy: bool = False,
) -> list[SimTask]:
    """The tasks of a sweep, in the order its rows come out: trace set, batch size, then policy as given.
    One task per trace set and batch size (its policies share one baseline), or with by_policy one per
    policy too (more tasks to spread, each simulating its own baseline; not under lengths="common")."""
    together = not by_policy or opts.get("lengths") == "common"
    out = []
    for name in trace_sets:
        for b in dict.fromkeys(int(x) for x in batch_sizes):
            if together:
                out.append(SimTask(name, tuple(policies), b))
            else:
                out.extend(SimTask(name, (p,), b) for p in policies)
    return out


def run_task(
    traces: list[RequestTrace],
    cost_model: str | CostModel,
    task: SimTask,
    batching: str,
    aggregate: str,
    seed: int,
    opts: dict[str, Any],
) -> list[SimResult]:
    """One task: `simulate()` over one trace set, its policies and one batch size."""
    return simulate(
        traces, cost_model, list(task.policies), batching, [task.batch_size], aggregate, seed, **opts
    )


def simulate_sweep(
    trace_sets: dict[str, list[RequestTrace]],
    cost_model: str | CostModel,
    policies: list[str],
    batching: str,
    batch_sizes: list[int],
    aggregate: str = "total",
    seed: int = 42,
    ray_address: str | None = None,
    echo: Callable[[str], None] = print,
    by_policy: bool = False,
    **opts: Any,
) -> list[tuple[str, SimResult]]:
    """Every policy at every batch size on every trace set: (trace set, result) rows ordered by trace set,
    batch size, then policy as given. ray_address: run the tasks on that Ray cluster ("auto": the running
    one, else a local one on loopback); None: here, one after the other. Each result's notes are those of
    every task of its trace set. by_policy: one task per policy too (see plan)."""
    check_args(policies, batching, batch_sizes, aggregate, opts)  # bad input fails here, not in a task
    tasks = plan(list(trace_sets), policies, batch_sizes, opts, by_policy)
    if ray_address is None:
        parts = [
            run_task(trace_sets[t.trace_set], cost_model, t, batching, aggregate, seed, opts) for t in tasks
        ]
    else:
        parts = _on_ray(ray_address, trace_sets, cost_model, tasks, batching, aggregate, seed, opts, echo)
    rows: list[tuple[str, SimResult]] = []
    notes: dict[str, dict[str, None]] = {}
    for t, part in zip(tasks, parts, strict=True):
        for r in part:
            rows.append((t.trace_set, r))
            notes.setdefault(t.trace_set, {}).update(dict.fromkeys(r.notes))
    for name, r in rows:
        r.notes = list(notes[name])
    return rows


def _on_ray(
    address: str,
    trace_sets: dict[str, list[RequestTrace]],
    cost_model: str | CostModel,
    tasks: list[SimTask],
    batching: str,
    aggregate: str,
    seed: int,
    opts: dict[str, Any],
    echo: Callable[[str], None],
) -> list[list[SimResult]]:
    from speclab.raycluster import ray_cluster

    with ray_cluster(address, None, echo) as ray:
        fn = ray.remote(num_cpus=1, max_retries=2)(run_task)  # pure: a retry repeats nothing observable
        refs = {
            name: ray.put(tr) for name, tr in trace_sets.items() if any(t.trace_set == name for t in tasks)
        }
        futures = [
            fn.remote(refs[t.trace_set], cost_model, t, batching, aggregate, seed, opts) for t in tasks
        ]
        try:
            return ray.get(futures)
        except ray.exceptions.RayTaskError as exc:
            from speclab.errors import SpeclabError

            cause = getattr(exc, "cause", None)
            if isinstance(cause, SpeclabError):  # the user's one-line error, as it would be without Ray
                raise type(cause)(str(cause)) from None
            raise
