"""Parser micro-benchmark: parse + serialize µs for chat bodies, and SSE usage-parser cost per chunk.

    python -m bench.parsers [--quick]

Bodies are OpenAI chat requests of 1 KB / 100 KB / 400 KB (prose with some quotes and newlines,
as JSON-encoded by a client), with and without a nested ``"model"`` key (a tool schema property,
which forces the depth-tracking path when the model is rewritten). Reported per size: parse,
serialize with the model unchanged (zero copy), serialize with the model rewritten (byte splice),
and the baselines ``orjson.loads`` and ``orjson.dumps`` of the same body measured in the same run.
SSE: µs per chunk for token chunks without usage, with ``"usage": null``, and the final usage chunk.
Prints a table and writes bench/results/parsers.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from epp.parsers.plugins.openai import OpenAIParser
from epp.parsers.sse import SseUsageParser
from epp.plugin.base import NoParams
from epp.testing.plugins import FakeHandle

RESULTS = Path(__file__).parent / "results" / "parsers.json"
SIZES = (1_000, 100_000, 400_000)
HEADERS = {":path": "/v1/chat/completions"}
WORDS = ("the", "model", "server", "cache", 'say "hi"', "prefix", "token", "route\n", "Envoy", "é")


def chat_body(size: int, nested_model: bool, seed: int) -> bytes:
    rng = random.Random(seed)
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant."}]
    total = 0
    while total < size:
        text = " ".join(rng.choice(WORDS) for _ in range(min(400, max(8, (size - total) // 6))))
        messages.append({"role": "user" if len(messages) % 2 else "assistant", "content": text})
        total += len(text) + 40
    doc: dict[str, Any] = {
        "messages": messages,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "max_tokens": 128,
    }
    if nested_model:
        doc["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": "pick",
                    "parameters": {"type": "object", "properties": {"model": {"type": "string"}}},
                },
            }
        ]
    doc["stream"] = True
    return orjson.dumps(doc)


def timed(fn: Callable[[], object], iterations: int) -> dict[str, float]:
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return {
        "p50": round(statistics.median(samples), 2),
        "p99": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 2),
    }


def bench_body(parser: OpenAIParser, size: int, nested: bool, iterations: int) -> dict[str, Any]:
    raw = chat_body(size, nested, seed=size + nested)
    body = parser.parse_request(raw, HEADERS)
    assert body.json is not None
    rewritten = parser.parse_request(raw, HEADERS)
    assert rewritten.json is not None
    rewritten.json["model"] = "meta-llama/Llama-3.1-8B-Instruct-lora-7"
    assert parser.serialize_request(body) is raw
    assert orjson.loads(parser.serialize_request(rewritten))["model"].endswith("lora-7")
    obj = orjson.loads(raw)
    return {
        "bytes": len(raw),
        "nested_model_key": nested,
        "parse_us": timed(lambda: parser.parse_request(raw, HEADERS), iterations),
        "serialize_unchanged_us": timed(lambda: parser.serialize_request(body), iterations),
        "serialize_rewritten_us": timed(lambda: parser.serialize_request(rewritten), iterations),
        "baseline_orjson_loads_us": timed(lambda: orjson.loads(raw), iterations),
        "baseline_orjson_dumps_us": timed(lambda: orjson.dumps(obj), iterations),
    }


def bench_sse(iterations: int) -> dict[str, Any]:
    head = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    token = head + b'[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}\n\n'
    token_null = head + b'[{"index":0,"delta":{"content":" hi"},"finish_reason":null}],"usage":null}\n\n'
    usage = head + (
        b'[],"usage":{"prompt_tokens":812,"total_tokens":940,"completion_tokens":128,'
        b'"prompt_tokens_details":{"cached_tokens":512}}}\n\ndata: [DONE]\n\n'
    )
    out: dict[str, Any] = {}
    for name, chunk in (
        ("token_chunk", token),
        ("token_chunk_usage_null", token_null),
        ("usage_chunk", usage),
    ):
        parser = SseUsageParser()
        out[name] = {"bytes": len(chunk), "us": timed(lambda c=chunk, p=parser: p.feed(c, False), iterations)}  # type: ignore[misc]
    split = SseUsageParser()
    half = len(usage) // 2
    out["usage_chunk_split_in_two"] = {
        "bytes": len(usage),
        "us": timed(lambda: (split.feed(usage[:half], False), split.feed(usage[half:], False)), iterations),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.parsers", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    iterations = 100 if args.quick else 1000
    parser = OpenAIParser("openai-parser", NoParams(), FakeHandle())

    print(
        f"{'bytes':>8} {'nested':>6} | {'parse':>8} {'ser=':>6} {'ser~':>8} | {'loads':>8} {'dumps':>8}"
        "  (p50 µs; ser= unchanged, ser~ model rewritten)"
    )
    cells = []
    for size in SIZES:
        for nested in (False, True):
            c = bench_body(parser, size, nested, iterations if size < 400_000 else max(iterations // 4, 50))
            cells.append(c)
            print(
                f"{c['bytes']:>8} {nested!s:>6} | {c['parse_us']['p50']:>8.1f} "
                f"{c['serialize_unchanged_us']['p50']:>6.2f} {c['serialize_rewritten_us']['p50']:>8.1f} | "
                f"{c['baseline_orjson_loads_us']['p50']:>8.1f} {c['baseline_orjson_dumps_us']['p50']:>8.1f}"
            )
    sse = bench_sse(iterations * 20)
    for name, cell in sse.items():
        print(
            f"sse {name:<26} {cell['bytes']:>4} B"
            f"  p50 {cell['us']['p50']:.2f} µs  p99 {cell['us']['p99']:.2f} µs"
        )
    doc = {
        "benchmark": "parsers",
        "mode": "quick" if args.quick else "full",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "chat_bodies": cells,
        "sse": sse,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
