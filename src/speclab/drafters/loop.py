"""The training loop and the cache entry every drafter trainer shares (the EAGLE-3 head, speclab.drafters.train,
and the distilled draft model, speclab.drafters.distill): AdamW with warmup + cosine decay over batches in a
seeded order, a time budget, a held-out acceptance curve with progress lines, and the checkpoint published
atomically with its manifest.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from speclab.atomic import exclusive_lock
from speclab.drafters.data import Sequence
from speclab.drafters.evaluate import evaluation_by_source
from speclab.models.prepare import publish_build, read_manifest


def start_run(seed: int, threads: int | None) -> float:
    """Seed torch (initialisation) and set its threads for one training run; returns the run's start time."""
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    return time.perf_counter()


@contextlib.contextmanager
def cache_entry(root: Path, name: str) -> Iterator[Path]:
    """The cache entry root/name, locked while the caller finds or trains it (one training per recipe at a
    time; a waiter then finds it cached)."""
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{name}.lock"):
        yield root / name


def target_identity(path: Path) -> Any:
    """What a trained drafter's cache key takes from its target: the checkpoint's file checksums."""
    m = read_manifest(path)
    return m["files"] if m else str(path)


def manifest_head(
    kind: str, version: str, recipe: Any, target_dir: Path, data: dict[str, Any]
) -> dict[str, Any]:
    """The first fields of a trained drafter's manifest: what it is, its recipe, its target and its data."""
    return {
        "kind": kind,
        "recipe_version": version,
        "recipe": asdict(recipe),
        "target_dir": str(target_dir),
        "target_files": target_identity(target_dir),
        "data": data,
    }


def fit(
    model: Any,
    train: list[Sequence],
    batches: list[list[int]],
    loss: Callable[[list[Sequence]], torch.Tensor],
    metrics: Callable[[], dict[str, Any]],
    recipe: Any,
    log: Any,
    max_minutes: float | None = None,
    track_loss: tuple[str, str] | None = None,
    clock: tuple[float, float | None] | None = None,
) -> dict[str, Any]:
    """Train `model`'s trainable parameters for recipe.epochs passes over `batches` (lists of training-set
    indices into `train`; each epoch visits them in a fresh order from random.Random(recipe.seed)), with AdamW at
    recipe.lr, linear warmup over the first 1/20 of the steps then cosine decay, gradients clipped to norm 1.

    `loss(sequences)` is a batch's loss; `metrics()` the held-out acceptance, measured at the start, at
    recipe.evals points spread over the steps and at the end (the curve, each point logged as a progress
    line). `max_minutes` stops training after that long (recorded as time_capped). `track_loss` = (key,
    label): also put the mean training loss since the last point on the curve under `key` and in the progress
    line as `label`. `clock` = (run start, deadline) in time.perf_counter() seconds: each curve point also
    records the seconds since the run started (data stage included), and with a deadline the whole run is
    held to it: the cosine decay follows whichever is further along, the steps or the time left before the
    deadline, and training stops there (recorded as time_capped; the result then depends on the machine's
    speed). Leaves the model in eval mode; returns the training statistics for the manifest."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    rng = random.Random(recipe.seed)
    total = max(len(batches) * recipe.epochs, 1)
    warm = max(total // 20, 1)
    run_start, deadline = clock if clock is not None else (None, None)
    t_begin = time.perf_counter()

    def progress(s: int) -> float:
        frac = s / total
        if deadline is not None:
            frac = max(frac, (time.perf_counter() - t_begin) / max(deadline - t_begin, 1e-9))
        return min(frac, 1.0)

    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, 0.5 * (1 + math.cos(math.pi * progress(s))))
    )
    eval_at = {round(total * i / recipe.evals) for i in range(1, recipe.evals + 1)}
    curve: list[dict[str, Any]] = []
    losses: list[float] = []
    t0, seen, step, capped = time.perf_counter(), 0, 0, False

    def evaluate() -> None:
        m = metrics()
        point: dict[str, Any] = {
            "step": step,
            "train_tokens": seen,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if run_start is not None:
            point["run_seconds"] = round(time.perf_counter() - run_start, 1)
        shown = ""
        if track_loss is not None:
            mean = round(sum(losses) / len(losses), 4) if losses else None
            point[track_loss[0]] = mean
            shown = f", {track_loss[1]} {mean}"
        losses.clear()
        curve.append({**point, **m})
        overall = m.get("all", {})
        log(
            f"step {step}/{total}: {seen} tokens, {point['seconds']} s{shown}, first-acc "
            f"{overall.get('first_acceptance')}, tokens/step {overall.get('tokens_per_step')}"
        )

    evaluate()  # the curve's start: the drafter as initialised from the target
    for _ in range(recipe.epochs):
        order = list(batches)
        rng.shuffle(order)
        for b in order:
            model.train()
            value = loss([train[i] for i in b])
            opt.zero_grad()
            value.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            if track_loss is not None:
                losses.append(float(value.detach()))
            step += 1
            seen += sum(len(train[i].tokens) for i in b)
            if step in eval_at:
                evaluate()
            over = max_minutes is not None and time.perf_counter() - t0 > max_minutes * 60
            if over or (deadline is not None and time.perf_counter() >= deadline):
                capped = True
                break
            if (
                run_start is not None
                and deadline is not None
                and step not in eval_at
                and _eval_due(curve, run_start, deadline, recipe.evals)
            ):
                evaluate()
        if capped:
            break
    if not curve or curve[-1]["step"] != step:
        evaluate()
    model.eval()
    return {
        "steps": step,
        "planned_steps": total,
        "train_tokens": seen,
        "time_capped": capped,
        "train_seconds": round(time.perf_counter() - t0, 1),
        "curve": curve,
    }


def _eval_due(curve: list[dict[str, Any]], run_start: float, deadline: float, evals: int) -> bool:
    """Under a deadline the step count may never reach the planned evaluation points: also evaluate when a
    1/evals share of the run's time has passed since the last point."""
    if not curve:
        return False
    last = run_start + curve[-1]["run_seconds"]
    return time.perf_counter() - last >= (deadline - run_start) / max(evals, 1)


def build_dir(root: Path, kind: str) -> Path:
    """A fresh build directory beside the cache entry, readable like any directory (mkdtemp makes 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-build-", dir=root))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def publish_drafter(
    root: Path,
    out: Path,
    kind: str,
    save: Callable[[Path], None],
    head: dict[str, Any],
    stats: dict[str, Any],
    t_start: float,
) -> None:
    """Save a trained drafter (`save(directory)`) into a build directory (`.<kind>-build-*` in `root`) and swap
    it in at `out` with its
    manifest: `head` (kind, recipe, target, data, ...) then the training statistics, the last curve point and
    its figures keyed by evaluation source (each marked left out of training or not),
    the time since `t_start`, the peak memory and the torch threads."""
    tmp = build_dir(root, kind)
    try:
        save(tmp)
        final = stats["curve"][-1] if stats["curve"] else None
        manifest = {
            **head,
            "training": stats,
            "final": final,
            "evaluation": evaluation_by_source(final, head["recipe"]),
            "total_seconds": round(time.perf_counter() - t_start, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "torch_threads": torch.get_num_threads(),
        }
        publish_build(tmp, out, manifest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
