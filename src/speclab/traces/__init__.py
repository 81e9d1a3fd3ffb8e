"""Acceptance traces: the model (per request, per output position, per method) and the Parquet store."""

from speclab.traces.model import CATEGORIES, KNOWN_METHODS, MethodTrace, RequestTrace, check_method_name
from speclab.traces.store import append_to_store, export_jsonl, read_jsonl, read_store, write_store

__all__ = [
    "CATEGORIES",
    "KNOWN_METHODS",
    "MethodTrace",
    "RequestTrace",
    "append_to_store",
    "check_method_name",
    "export_jsonl",
    "read_jsonl",
    "read_store",
    "write_store",
]
