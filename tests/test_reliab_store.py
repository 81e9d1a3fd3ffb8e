"""The trace store survives kills and concurrent writers.

- SIGKILL of `traces import --force` at random points (subprocess): the store is the old one or the new one;
- failures injected at each step of a replace (both the atomic swap and the fallback without it);
- two concurrent `--append` imports both keep their records; the same file twice: one is refused;
- stores written with the old int16 schema still read.
"""

from __future__ import annotations

import os
import random
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import speclab.traces.store as store_mod
from reliab_helpers import cli_subprocess, write_study  # tests/ is on sys.path
from speclab.errors import TraceError
from speclab.traces import MethodTrace, RequestTrace, read_store, write_store
from speclab.traces.store import append_to_store

# more kills locally: SPECLAB_KILLS=60 pytest tests/test_reliab_store.py
KILLS = int(os.environ.get("SPECLAB_KILLS", "6"))


def rec(rid: str, n: int = 6) -> RequestTrace:
    return RequestTrace(
        id=rid,
        workload="w",
        category="other",
        prompt_len=2,
        output_len=n,
        methods={"ngram": MethodTrace(k_max=4, acc_len=[1 + i % 5 for i in range(n)])},
        prompt_token_ids=[1, 2],
        output_token_ids=list(range(n)),
    )


def ids(path) -> set[str]:
    return {r.id for r in read_store(path)}


def leftovers(store) -> list[str]:
    hidden = [p.name for p in store.parent.glob(f".{store.name}.*") if not p.name.endswith(".lock")]
    return hidden + [p.name for p in store.glob(".*tmp")] if store.is_dir() else hidden


def make_old(store) -> set[str]:
    write_store(store, [rec(f"old{i}") for i in range(50)])
    append_to_store(store, [rec(f"old{i}") for i in range(50, 80)], tag="more")
    return ids(store)


def test_sigkill_during_force_import_leaves_old_or_new(tmp_path):
    store = tmp_path / "store"
    new_ids = [f"new{i}" for i in range(3000)]
    src = write_study(tmp_path / "new.jsonl", new_ids, n=30)
    old = make_old(store)
    rng = random.Random(1234)
    seen = {"old": 0, "new": 0, "during replace": 0}
    for i in range(KILLS):
        proc = cli_subprocess(
            "traces", "import", "--format", "specdecode-bench", src, "--out", store, "--force"
        )
        if i % 2 == 0:
            time.sleep(rng.uniform(0.0, 3.0))  # anywhere: start-up, parsing, writing, swapping
        else:
            # aim at the replace itself: as soon as the new store's hidden directory appears
            t0 = time.time()
            while not list(tmp_path.glob(".store.new-*")) and proc.poll() is None and time.time() - t0 < 60:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.2))
        proc.kill()
        proc.communicate()
        seen["during replace"] += bool(list(tmp_path.glob(".store.new-*")))  # killed mid-way: leftovers
        now = ids(store)
        assert now in (old, set(new_ids)), f"kill {i}: store has {len(now)} records, neither old nor new"
        seen["old" if now == old else "new"] += 1
        if now != old:
            write_store(store, [rec(f"old{i}") for i in range(50)])  # start again from an old store
            append_to_store(store, [rec(f"old{i}") for i in range(50, 80)], tag="more")
    # the next writer finishes the job and cleans what the kills left behind
    proc = cli_subprocess("traces", "import", "--format", "specdecode-bench", src, "--out", store, "--force")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert ids(store) == set(new_ids)
    assert leftovers(store) == []
    print(f"kills: {seen}")


@pytest.mark.parametrize("atomic_swap", [True, False])
@pytest.mark.parametrize("step", ["write", "swap", "cleanup"])
def test_failure_at_each_step_of_a_replace(tmp_path, monkeypatch, atomic_swap, step):
    store = tmp_path / "store"
    old = make_old(store)
    real_rename, real_rmtree = os.rename, shutil.rmtree
    if not atomic_swap:
        monkeypatch.setattr(store_mod, "_exchange", lambda a, b: False)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    if step == "write":
        monkeypatch.setattr(store_mod, "_write_part", boom)
    elif step == "swap" and atomic_swap:
        monkeypatch.setattr(store_mod, "_exchange", boom)
    elif step == "swap":
        calls = []

        def second_rename_fails(a, b):
            calls.append(a)
            if len(calls) == 2:
                boom()
            real_rename(a, b)

        monkeypatch.setattr(store_mod.os, "rename", second_rename_fails)
    else:
        monkeypatch.setattr(
            store_mod.shutil, "rmtree", lambda p, **k: boom() if not k else real_rmtree(p, **k)
        )
    with pytest.raises(OSError):
        write_store(store, [rec("n1"), rec("n2")])
    monkeypatch.undo()
    # a failure before the swap keeps the old store; after it (cleanup), the new one is complete
    assert ids(store) == ({"n1", "n2"} if step == "cleanup" else old)
    write_store(store, [rec("n3")])
    assert ids(store) == {"n3"} and leftovers(store) == []


def test_old_store_moved_aside_by_a_killed_fallback_replace_is_restored(tmp_path):
    store = tmp_path / "store"
    old = make_old(store)
    os.rename(store, tmp_path / ".store.old-deadbeef")  # killed between the fallback's two renames
    with pytest.raises(TraceError, match="rename it back"):
        read_store(store)
    append_to_store(store, [rec("extra")])
    assert ids(store) == old | {"extra"}


def test_concurrent_appends_keep_every_record(tmp_path):
    store = tmp_path / "store"
    write_store(store, [rec("seed")])
    a = write_study(tmp_path / "a.jsonl", [f"a{i}" for i in range(1500)], n=20)
    b = write_study(tmp_path / "b.jsonl", [f"b{i}" for i in range(1500)], n=20)
    procs = [
        cli_subprocess("traces", "import", "--format", "specdecode-bench", f, "--out", store, "--append")
        for f in (a, b, a)
    ]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 0, 2], results  # the second import of a.jsonl is refused, nothing lost
    assert any("already in the store" in e for c, e in results if c == 2)
    assert ids(store) == {"seed"} | {f"a{i}" for i in range(1500)} | {f"b{i}" for i in range(1500)}


def test_part_names_do_not_collide(tmp_path):
    parts = {append_to_store(tmp_path / "s", [rec(f"x{i}")], tag="same-tag").name for i in range(20)}
    assert len(parts) == 20
    assert [r.id for r in read_store(tmp_path / "s")] == [f"x{i}" for i in range(20)]  # write order


def test_int16_store_of_schema_1_still_reads(tmp_path):
    old_method = pa.struct(
        [
            ("name", pa.string()),
            ("k_max", pa.int32()),
            ("acc_len", pa.list_(pa.int16())),
            ("num_proposed", pa.list_(pa.int16())),
        ]
    )
    schema = pa.schema(
        [(f.name, pa.list_(old_method) if f.name == "methods" else f.type) for f in store_mod.SCHEMA],
        metadata={"speclab.trace_schema": "1"},
    )
    row = {
        "id": ["a"],
        "workload": ["w"],
        "category": ["other"],
        "prompt_len": [1],
        "output_len": [3],
        "prompt_token_ids": [[7]],
        "output_token_ids": [[1, 2, 3]],
        "methods": [[{"name": "ngram", "k_max": 4, "acc_len": [1, 5, 2], "num_proposed": [0, 4, 4]}]],
        "meta": [None],
    }
    pq.write_table(pa.Table.from_pydict(row, schema=schema), tmp_path / "old.parquet")
    (r,) = read_store(tmp_path / "old.parquet")
    assert r.methods["ngram"].acc_len.tolist() == [1, 5, 2]
    assert np.array_equal(r.methods["ngram"].num_proposed, [0, 4, 4])


def test_readers_during_replaces_see_old_or_new(tmp_path):
    import threading

    store = tmp_path / "store"
    sets = [[rec(f"a{i}") for i in range(40)], [rec(f"b{i}") for i in range(60)]]
    write_store(store, sets[0])
    want = [{r.id for r in s} for s in sets]
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            write_store(store, sets[i % 2])

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(200):
            assert ids(store) in want
    finally:
        stop.set()
        t.join()
