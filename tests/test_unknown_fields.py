"""A sweep table with a field it does not know is refused in one line that lists the unknown fields (sorted)
and every known one: the same message for the top level, [engine], [server] and [workloads.NAME]."""

from __future__ import annotations

import pytest

from speclab.bench.spec import parse_sweep_text
from speclab.errors import ConfigError
from speclab.validation import unknown_fields

SWEEP = """
target = "t"
workloads = ["offline-math"]
batch_sizes = [1]

[[methods]]
name = "none"
"""


def _refusal(text: str) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_sweep_text(text, "s.toml")
    return str(ei.value)


def test_engine_and_server_tables_name_unknown_and_known_fields():
    engine = _refusal(SWEEP + "\n[engine]\nmax_num_seq = 4\nkv_gib = 1\n")
    assert engine == (
        "s.toml: engine: unknown field(s): kv_gib, max_num_seq "
        "(known: enforce_eager, kv_cache_gib, llm_kwargs, max_model_len, max_num_seqs)"
    )
    server = _refusal(SWEEP + "\n[server]\nconcurrency = [1]\nrate = 3\n")
    assert server.startswith(
        "s.toml: server: unknown field(s): rate (known: arrivals, burstiness, cell_timeout_s, "
    )


def test_known_fields_are_listed_in_the_order_given():
    with pytest.raises(ConfigError, match=r"^w: unknown field\(s\): a, b \(known: path, format\)$"):
        unknown_fields({"b": 1, "path": "x", "a": 2}, ("path", "format"), "w")
    unknown_fields({"path": "x"}, ("path", "format"), "w")  # nothing unknown: no error
