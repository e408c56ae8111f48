"""``epp explain``: replay a request offline through the server's assembly and print the decision."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.cli.explain import main
from epp.errors import ConfigError
from epp.explain.offline import Replay, load_snapshot, replay

ROOT = Path(__file__).resolve().parents[2]
PREFIX_AND_LOAD = str(ROOT / "config/examples/prefix-and-load.yaml")
CONFORMANCE = str(ROOT / "config/examples/conformance.yaml")
SNAPSHOT = str(ROOT / "docs/examples/explain-endpoints.yaml")
BODY = str(ROOT / "docs/examples/explain-body.json")

# The shape /debug/plugins/state serves (app.debug.debug_state): only what the replay reads matters.
DEBUG_STATE: dict[str, Any] = {
    "pool": None,
    "endpoints": [
        {
            "name": "a",
            "address": "10.1.0.1:8000",
            "labels": {"role": "decode"},
            "metrics": {"waitingQueueSize": 9, "runningRequestsSize": 3, "kvCacheUsagePercent": 0.9},
            "metricsAgeSeconds": 1.2,
            "health": {"available": True},
        },
        {
            "name": "b",
            "address": "10.1.0.2:8000",
            "labels": {},
            "metrics": {"waitingQueueSize": 0, "runningRequestsSize": 0, "kvCacheUsagePercent": 0.1},
        },
    ],
    "plugins": {},
}


def test_snapshot_from_debug_state_and_from_the_simple_file() -> None:
    eps = load_snapshot(orjson.dumps(DEBUG_STATE).decode())
    assert [(e.metadata.name, e.metadata.hostport) for e in eps] == [
        ("a", "10.1.0.1:8000"),
        ("b", "10.1.0.2:8000"),
    ]
    assert eps[0].metadata.labels == {"role": "decode"}
    assert eps[0].metrics.waiting_queue_size == 9 and eps[0].metrics.kv_cache_usage_percent == 0.9
    simple = load_snapshot("endpoints:\n- {address: 10.2.0.1, port: 9000}\n")
    assert simple[0].metadata.hostport == "10.2.0.1:9000" and simple[0].metadata.name == "10.2.0.1:9000"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", "non-empty 'endpoints'"),
        ("endpoints: [{name: x}]", "endpoints[0]: needs an 'address'"),
        ("endpoints: [{address: '10.0.0.1'}]", "endpoints[0]: missing port"),
        ("endpoints: [{address: '10.0.0.1:80', metrics: {waitingQueueSize: lots}}]", "endpoints[0]"),
    ],
)
def test_bad_snapshots_name_the_entry(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_snapshot(text)


async def test_replay_scores_every_candidate_and_picks_the_best_total() -> None:
    eps = load_snapshot(orjson.dumps(DEBUG_STATE).decode())
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'
    d = await replay(Replay(config_file=PREFIX_AND_LOAD, endpoints=eps, body=body))
    assert d["outcome"] == "routed" and d["admission"] == "admitted" and d["model"] == "m"
    [run] = d["profiles"]
    rows = {e["address"]: e for e in run["endpoints"]}
    assert set(rows) == {"10.1.0.1:8000", "10.1.0.2:8000"}
    for e in rows.values():  # each total is the sum of the weighted scores shown
        assert e["total"] == pytest.approx(sum(e["scores"].values()), abs=1e-5)
    # the idle endpoint wins on the metrics-driven scorers (queue, KV) and is picked
    assert rows["10.1.0.2:8000"]["scores"]["queue-scorer"] > rows["10.1.0.1:8000"]["scores"]["queue-scorer"]
    assert d["destination"] == "10.1.0.2:8000" and rows["10.1.0.2:8000"]["picked"]
    assert {"parse", "schedule"} <= set(d["stagesMicros"])


async def test_replay_shows_what_a_filter_dropped() -> None:
    eps = load_snapshot(orjson.dumps(DEBUG_STATE).decode())
    d = await replay(
        Replay(
            config_file=CONFORMANCE,
            endpoints=eps,
            body=b'{"model": "m", "prompt": "x"}',
            path="/v1/completions",
            headers={"test-epp-endpoint-selection": "10.1.0.1:8000"},
        )
    )
    [run] = d["profiles"]
    [(name, kept)] = [(f["name"], f["kept"]) for f in run["filters"]]
    assert name == "header-based-testing-filter" and kept == ["10.1.0.1:8000"]
    assert d["destination"] == "10.1.0.1:8000"


async def test_replay_of_a_bad_body_is_a_rejection_with_its_reason() -> None:
    eps = load_snapshot(orjson.dumps(DEBUG_STATE).decode())
    d = await replay(Replay(config_file=PREFIX_AND_LOAD, endpoints=eps, body=b"{not json"))
    assert d["outcome"] == "rejected" and d["reason"] == "rejected-bad-request"
    assert d["profiles"] == [] and d["admission"] == ""


def test_cli_prints_the_table_and_json() -> None:
    out = io.StringIO()
    code = main(["--config-file", PREFIX_AND_LOAD, "--endpoints", SNAPSHOT, "--body", BODY], stdout=out)
    assert code == 0
    text = out.getvalue()
    assert "queue-scorer x1" in text and "prefix-cache-scorer x4" in text and "<- picked" in text
    out = io.StringIO()
    stdin = io.StringIO('{"model": "m", "prompt": "hi"}')
    argv = ["--config-file", PREFIX_AND_LOAD, "--endpoints", SNAPSHOT, "--body", "-", "--json"]
    argv += ["--path", "/v1/completions", "--header", "x-request-id=abc"]
    assert main(argv, stdin=stdin, stdout=out) == 0
    d = orjson.loads(out.getvalue())
    assert d["requestId"] == "abc" and d["outcome"] == "routed"
    # the snapshot's idlest endpoint (vllm-0: empty queue, 20% KV) is the pick
    assert d["destination"] == "10.0.0.1:8000"


def test_cli_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--endpoints", "/nonexistent", "--body", BODY]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["--endpoints", SNAPSHOT, "--body", BODY, "--header", "novalue"]) == 1
    assert "expected K=V" in capsys.readouterr().err


def test_epp_explain_is_a_subcommand_of_epp() -> None:
    from epp.cli.main import main as epp_main

    with pytest.raises(SystemExit) as exit_info:
        epp_main(["explain", "--config-file", PREFIX_AND_LOAD, "--endpoints", SNAPSHOT, "--body", BODY])
    assert exit_info.value.code == 0


async def test_pd_replay_keeps_both_profiles_and_the_disaggregation() -> None:
    """llm-d's P/D example config on a role-labelled snapshot: the decode and the prefill run, each
    with its role filter's survivors, and the handler's decision with the prefill target."""
    text = (ROOT / "docs/examples/explain-endpoints-pd.yaml").read_text()
    d = await replay(
        Replay(
            config_file=str(ROOT / "config/examples/pd-disaggregation.yaml"),
            endpoints=load_snapshot(text),
            body=(ROOT / "docs/examples/explain-body.json").read_bytes(),
        )
    )
    runs = {run["profile"]: run for run in d["profiles"]}
    assert set(runs) == {"decode", "prefill"} and d["primaryProfile"] == "decode"
    assert runs["decode"]["filters"][0] == {
        "name": "decode-filter",
        "kept": ["10.0.2.1:8000", "10.0.2.2:8000"],
    }
    assert runs["prefill"]["filters"][0] == {
        "name": "prefill-filter",
        "kept": ["10.0.1.1:8000", "10.0.1.2:8000"],
    }
    assert d["destination"] in runs["decode"]["filters"][0]["kept"]
    assert d["disagg"]["decisionType"] == "prefill-decode"
    assert d["disagg"]["prefill"] == runs["prefill"]["picked"][0]
