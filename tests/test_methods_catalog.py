"""The method catalog: its derived lists agree with each other and with the code that acts on them."""

import pytest

from speclab.catalog import (
    CATALOG,
    ENGINE_METHODS,
    METHODS_NEEDING_MODEL,
    MODEL_BASED,
    MODEL_FREE,
    NGRAM_MAX_N,
    NGRAM_MIN_N,
    REPLAY_METHODS,
    TRACE_METHODS,
    trace_method_name,
)
from speclab.engine.protocol import EngineSpec
from speclab.errors import ConfigError, TraceError
from speclab.methods import make_proposer
from speclab.traces import check_method_name


def test_lists_partition_the_methods() -> None:
    assert set(MODEL_FREE) | set(MODEL_BASED) == set(TRACE_METHODS)
    assert not set(MODEL_FREE) & set(MODEL_BASED)
    assert set(ENGINE_METHODS) - set(TRACE_METHODS) == {"none", "custom_class"}
    assert set(REPLAY_METHODS) <= set(TRACE_METHODS)
    # the trace store accepts exactly the built-in trace names (and custom:<name>)
    for name in TRACE_METHODS:
        assert check_method_name(name) == name
    for name in ("none", "custom_class", "medusa"):
        with pytest.raises(TraceError):
            check_method_name(name)


def test_trace_method_name() -> None:
    assert trace_method_name("ngram", {"prompt_lookup_min": 2}) == "ngram"
    assert trace_method_name("custom_class", {"model": "pkg.mod.MyProposer"}) == "custom:MyProposer"
    assert trace_method_name("custom_class", {}) == "custom:custom"


@pytest.mark.parametrize("method", ENGINE_METHODS)
def test_the_job_protocol_asks_for_a_model_exactly_where_the_catalog_says(method: str) -> None:
    k = None if method == "none" else 2
    if method in METHODS_NEEDING_MODEL:
        with pytest.raises(ConfigError, match="options.model"):
            EngineSpec("t", method=method, k=k).validate()
        EngineSpec("t", method=method, k=k, options={"model": "x.Y"}).validate()
    else:
        assert CATALOG[method].model_option is None
        EngineSpec("t", method=method, k=k).validate()


def test_replay_proposers_exist_exactly_for_replay_methods() -> None:
    ngram = make_proposer("ngram")
    assert (ngram.min_n, ngram.max_n) == (NGRAM_MIN_N, NGRAM_MAX_N)
    assert make_proposer("suffix") is not None
    with pytest.raises(ConfigError, match="draft checkpoint"):
        make_proposer("draft_model")
    for method in set(TRACE_METHODS) - set(REPLAY_METHODS):
        with pytest.raises(ConfigError, match="no replay proposer"):
            make_proposer(method)


def test_catalog_protocol_and_timings_import_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, speclab.catalog, speclab.engine.protocol, speclab.timings, speclab.engine.launch\n"
        "print(sorted(m for m in ('torch', 'vllm', 'numpy', 'speclab.costmodel') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
