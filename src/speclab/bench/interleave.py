"""Repeats interleaved across engines (sweep `repeats = N` > 1).

Every engine of the sweep is started once (one at a time) and then kept, idle, in its own gated worker
process; the runner hands one unit (a cell's repeat) at a time to one worker and waits for it, so no two
engines ever run at once. Units go in rounds: repeat 1 of every cell, then repeat 2, ...; within a round,
for each (workload, batching, batch size) the no-SD baseline first, then each SD engine. So repeat i of an
SD cell is measured right after repeat i of its baseline (a matched pair under the same conditions), and
the repeats of one cell are minutes apart (a passing disturbance hits one of them, not all).

The cost: every engine of the sweep is resident at once (memory for all of them; on a GPU, give each a
share with llm_kwargs.gpu_memory_utilization), instead of one after the other.

With `restart_each_repeat = true` every engine is stopped when a round ends and started again for its
first unit of the next round: an engine start-up's speed offset (on the 2-core CPU the same forward differs
by 5-30% between start-ups and stays for the engine's life) then differs between the repeats of a cell,
and the median over repeats averages it instead of carrying it into every repeat of one entry.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import IO, Any

from speclab.bench.attempts import Attempt, new_attempt
from speclab.bench.cells import Cell, EngineGroup
from speclab.bench.repeats import split_unit, unit_id
from speclab.bench.strategy import SweepHost
from speclab.engine.launch import ResultTail, describe_exit, launch_worker, log_tail, stop_worker
from speclab.engine.protocol import GATE_DONE, gate_ready_path


@dataclass
class _Live:
    """A started gated worker."""

    att: Attempt
    proc: subprocess.Popen[bytes]
    log: IO[Any]
    tail: ResultTail
    started: float


@dataclass
class _GroupState:
    group: EngineGroup  # its cells are the pending units
    live: _Live | None = None
    crashes: int = 0  # in a row, without a finished unit
    dead: str | None = None  # why no more units run on this engine
    done: set[str] = field(default_factory=set)


def unit_groups(groups: list[EngineGroup], missing: dict[str, list[int]]) -> list[EngineGroup]:
    """The engine groups with their pending units (Cell copies whose cell_id is the unit id)."""
    out = []
    for g in groups:
        units = [
            replace(c, cell_id=unit_id(c.cell_id, r)) for c in g.cells for r in missing.get(c.cell_id, [])
        ]
        if units:
            out.append(EngineGroup(engine_id=g.engine_id, engine=g.engine, cells=units))
    return out


class Interleaver:
    def __init__(self, host: SweepHost, groups: list[EngineGroup]) -> None:
        self.r = host
        self.states = [_GroupState(g) for g in groups]  # baseline engines first (group_engines)

    def order(self) -> list[tuple[_GroupState, Cell]]:
        """Rounds of repeats; in a round, each (workload, batching, batch size, sampling setting) with its
        baseline first."""
        wl = self.r.spec.workloads
        items = [
            (
                split_unit(u.cell_id)[1],
                wl.index(u.workload),
                u.batching,
                u.batch_size,
                u.setting_rank,
                gi,
                st,
                u,
            )
            for gi, st in enumerate(self.states)
            for u in st.group.cells
        ]
        items.sort(key=lambda t: t[:6])
        return [(t[6], t[7]) for t in items]

    def run(self) -> None:
        clean = False
        restart = bool(getattr(self.r.spec, "restart_each_repeat", False))
        round_now: int | None = None
        try:
            for st, unit in self.order():
                rep = split_unit(unit.cell_id)[1]
                if restart and round_now is not None and rep != round_now:
                    for other in self.states:  # a new round: every engine starts anew
                        if other.live is not None:
                            self._close(other, polite=True)
                round_now = rep
                self._unit(st, unit)
            clean = True
        finally:
            for st in self.states:
                if st.live is not None:
                    self._close(st, polite=clean)

    # --- one unit -----------------------------------------------------------------------------------------
    def _unit(self, st: _GroupState, unit: Cell) -> None:
        r = self.r
        uid = unit.cell_id
        if uid in st.done:
            return
        cid, rep = split_unit(uid)
        if rep > 1 and not r.cell_ok(cid):
            # repeat 1 failed: the cell has no row to add repeats to
            r.drop_unit(unit)
            return
        if st.dead is not None:
            r.fail_unit(unit, st.group, st.dead)
            return
        live = self._ensure(st)
        if live is None or uid in st.done:  # the engine did not start (its failed results are in)
            if uid not in st.done:
                r.fail_unit(unit, st.group, st.dead or "engine did not start")
            return
        with open(live.att.gate_path, "a") as fh:
            fh.write(uid + "\n")
        r.progress.status(f"{unit.method.label} {unit.workload} b{unit.batch_size} repeat {rep}")
        last = time.time()
        while True:
            rc = live.proc.poll()
            self._take(st, live)
            if uid in st.done:
                st.crashes = 0
                return
            if rc is not None:
                reason = f"engine worker {describe_exit(rc)}"
                tail = log_tail(live.att.log_path)
                self._crashed(st, unit, reason + (f": {tail}" if tail else ""))
                return
            if r.cell_timeout_s and time.time() - last > r.cell_timeout_s:
                stop_worker(live.proc)
                self._take(st, live)
                self._crashed(st, unit, f"no cell finished within {r.cell_timeout_s:.0f} s (hung? stopped)")
                return
            r.progress.tick()
            time.sleep(r.poll_s)

    def _crashed(self, st: _GroupState, unit: Cell, reason: str) -> None:
        assert st.live is not None
        self._close(st, polite=False)
        st.done.add(unit.cell_id)
        self.r.fail_unit(unit, st.group, reason)
        st.crashes += 1
        if st.crashes >= 2:
            st.dead = f"not run: engine failed twice in a row ({reason})"
        else:
            self.r.progress.line(f"  restarting engine {st.group.engine_id} for its remaining units")

    # --- workers ------------------------------------------------------------------------------------------
    def _ensure(self, st: _GroupState) -> _Live | None:
        """The group's running worker, started (and warm) if needed; None when it cannot start."""
        r = self.r
        if st.live is not None and st.live.proc.poll() is None:
            return st.live
        if st.live is not None:
            self._close(st, polite=False)
        while st.dead is None:
            remaining = [u for u in st.group.cells if u.cell_id not in st.done]
            if not remaining:
                return None
            prompt_sets = {u.workload: r.prompts_for(u.workload) for u in remaining}
            att = new_attempt(r.run_dir, st.group, remaining, prompt_sets, gated=True)
            r.progress.status(f"{st.group.engine_id}: starting engine")
            r.launched(st.group)
            log = open(att.log_path, "wb")  # noqa: SIM115 - closed in _close
            proc = launch_worker(
                att.job_path.resolve(),
                att.cells_path.resolve(),
                kv_cache_gib=st.group.engine.kv_cache_gib,
                log=log,
            )
            st.live = _Live(att, proc, log, ResultTail(att.cells_path), time.time())
            ready = gate_ready_path(att.gate_path)
            while not ready.exists() and proc.poll() is None:
                if r.cell_timeout_s and time.time() - st.live.started > r.cell_timeout_s:
                    stop_worker(proc)
                    break
                r.progress.tick()
                time.sleep(r.poll_s)
            if ready.exists() and proc.poll() is None:
                return st.live
            # it never got ready: take what it reported (a worker whose engine cannot start fails every cell)
            rc = proc.wait()
            got = self._take(st, st.live)
            reason = f"engine worker {describe_exit(rc)}"
            tail = log_tail(att.log_path)
            self._close(st, polite=False)
            if got:
                return None
            st.crashes += 1
            if st.crashes >= 2:
                st.dead = f"not run: engine failed twice in a row ({reason}{f': {tail}' if tail else ''})"
        return None

    def _take(self, st: _GroupState, live: _Live) -> bool:
        before = set(live.att.done)
        self.r.take_results(live.att, live.tail, live.started)
        new = live.att.done - before
        st.done |= new
        return bool(new)

    def _close(self, st: _GroupState, polite: bool) -> None:
        live = st.live
        if live is None:
            return
        st.live = None
        if polite and live.proc.poll() is None:
            with open(live.att.gate_path, "a") as fh:
                fh.write(GATE_DONE + "\n")
            with contextlib.suppress(subprocess.TimeoutExpired):
                live.proc.wait(timeout=60)
        stop_worker(live.proc)
        with contextlib.suppress(Exception):
            self._take(st, live)
        live.log.close()
