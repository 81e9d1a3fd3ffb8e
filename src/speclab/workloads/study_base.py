"""A study dataset in one declaration: where it lives, which columns a row needs, how a row becomes a prompt.

Adding a dataset = one small module under speclab/workloads/study/ (or a plugin) that calls register_study.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speclab.workloads.base import Prompt, WorkloadError, WorkloadInfo, seeded_sample, user
from speclab.workloads.registry import register_workload
from speclab.workloads.sources import read_hub, read_local

# row, per-row rng -> (messages, reference, extra meta, body span of the last message for truncation or None)
ToPrompt = Callable[[dict, random.Random], tuple[list[dict], str | None, dict, tuple[int, int] | None]]


@dataclass(frozen=True)
class StudyDataset:
    name: str
    category: str
    hf_id: str
    config: str | None
    split: str
    columns: dict[str, type | tuple[type, ...]]  # required columns and their type(s)
    to_prompt: ToPrompt
    description: str
    notes: str = ""
    hub_note: str = ""  # said in the error when the hub load fails (gated, small, ...)
    data_files: str | None = None  # for hub repos that are plain files (ShareGPT)
    id_column: str | None = None
    keep: Callable[[dict], bool] | None = None  # rows to skip silently-but-counted (e.g. empty chats)
    check_row: Callable[[dict], str | None] | None = None  # extra per-row check: an error text or None
    extra: dict[str, Any] = field(default_factory=dict)

    def info(self) -> WorkloadInfo:
        return WorkloadInfo(
            name=self.name,
            category=self.category,
            kind="study",
            description=self.description,
            hf_id=self.hf_id,
            hf_config=self.config,
            split=self.split,
            notes=self.notes,
        )


def single_user(content: str) -> list[dict]:
    return [user(content)]


def _type_name(typ: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in typ) if isinstance(typ, tuple) else typ.__name__


def _check(ds: StudyDataset, loc: str, row: Any) -> dict:
    if not isinstance(row, dict):
        raise WorkloadError(
            f"{ds.name}: malformed row at {loc}: expected an object, got {type(row).__name__}"
        )
    for col, typ in ds.columns.items():
        if col not in row or row[col] is None:
            have = ", ".join(map(str, list(row)[:12]))
            raise WorkloadError(f"{ds.name}: malformed row at {loc}: missing field {col!r} (has: {have})")
        if not isinstance(row[col], typ):
            raise WorkloadError(
                f"{ds.name}: malformed row at {loc}: field {col!r} should be {_type_name(typ)}, "
                f"got {type(row[col]).__name__}"
            )
    if ds.check_row is not None:
        problem = ds.check_row(row)
        if problem:
            raise WorkloadError(f"{ds.name}: malformed row at {loc}: {problem}")
    return row


def build_study(ds: StudyDataset, limit: int | None, seed: int, source: str | None) -> list[Prompt]:
    if source:
        rows = read_local(source, ds.config, ds.split)
        where = str(source)
    else:
        rows = read_hub(ds.name, ds.hf_id, ds.config, ds.split, ds.data_files, ds.hub_note)
        where = ds.hf_id
    if not rows:
        raise WorkloadError(f"{ds.name}: {where} has no rows (empty dataset)")
    checked = [(i, loc, _check(ds, loc, row)) for i, (loc, row) in enumerate(rows)]
    usable = [t for t in checked if ds.keep is None or ds.keep(t[2])]
    if not usable:
        raise WorkloadError(f"{ds.name}: none of the {len(rows)} rows in {where} is usable")
    skipped = len(checked) - len(usable)
    usable = seeded_sample(usable, limit, seed)  # like the study: random.sample, in sampled order
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for i, loc, row in usable:
        messages, reference, meta, span = ds.to_prompt(row, random.Random(f"{seed}:{i}"))
        key = row.get(ds.id_column) if ds.id_column else None
        pid = f"{ds.name}-{key}" if key not in (None, "") else f"{ds.name}-{i}"
        if pid in seen:
            pid = f"{ds.name}-{key}-{i}"
        seen.add(pid)
        # skipped_rows: rows of the dataset left out by ds.keep (recorded so filtering is never silent)
        meta = {"source": loc, "row": i, "dataset_rows": len(rows), "skipped_rows": skipped, **meta}
        if span is not None:
            meta["truncate"] = {"message": len(messages) - 1, "start": span[0], "end": span[1]}
        prompts.append(Prompt(pid, ds.name, ds.category, messages, reference, meta))
    return prompts


def register_study(ds: StudyDataset) -> None:
    register_workload(ds.info(), lambda limit, seed, source: build_study(ds, limit, seed, source))
