"""Issue #14: the deprecated metrics flags and the engine tables are declared once; the rest derive."""

from __future__ import annotations

import dataclasses

from epp.app.build import MetricsFlags
from epp.cli.flags import DEFAULTS, FLAGS, Options, parse_flags
from epp.datalayer import legacy_poller
from epp.datalayer.engines import BUILTIN_ENGINES, EngineMapping, EngineTable, builtin_engine
from epp.datalayer.extractors.core_metrics import EngineConfigParams
from epp.datalayer.sources.metrics_http import (
    MODEL_SERVER_METRICS_FLAGS,
    MetricsDataSourceParams,
    ModelServerMetricsFlags,
)


def test_metrics_flags_are_the_declared_flags_with_the_parameter_defaults() -> None:
    flags = {f.name: f for f in FLAGS}
    options = {f.name for f in dataclasses.fields(Options)}
    for declared in MODEL_SERVER_METRICS_FLAGS:
        assert flags[declared.flag].kind == declared.kind
        assert flags[declared.flag].help == declared.help
        assert declared.flag.replace("-", "_") in options
    params = MetricsDataSourceParams()
    defaults = ModelServerMetricsFlags()
    assert (defaults.scheme, defaults.path, defaults.insecure_skip_verify) == (
        params.scheme,
        params.path,
        params.insecure_skip_verify,
    )
    assert MetricsFlags is ModelServerMetricsFlags
    assert DEFAULTS.model_server_metrics == defaults


def test_explicit_flags_become_camel_case_parameters() -> None:
    opts = parse_flags(
        ["--endpoints=127.0.0.1:8000", "--model-server-metrics-https-insecure-skip-verify=false"], {}
    )
    assert opts.model_server_metrics.explicit_params() == {"insecureSkipVerify": False}
    by_flag_name = ModelServerMetricsFlags(path="/m", explicitly_set=frozenset({"model-server-metrics-path"}))
    assert by_flag_name.explicit_params() == {"path": "/m"}


def test_engine_tables_have_one_schema() -> None:
    assert EngineConfigParams is EngineTable
    vllm = builtin_engine("vllm")
    assert vllm in BUILTIN_ENGINES
    mapping = EngineMapping.from_table(vllm)
    assert (
        mapping.queued,
        mapping.running,
        mapping.kv_usage,
        mapping.lora,
        mapping.cache_info,
    ) == (
        legacy_poller.QUEUED,
        legacy_poller.RUNNING,
        legacy_poller.KV_USAGE,
        legacy_poller.LORA_INFO,
        legacy_poller.CACHE_INFO,
    )
    assert DEFAULTS.total_queued_requests_metric == vllm.queued_requests_spec
    assert DEFAULTS.cache_info_metric == vllm.cache_info_spec
