"""Costs of precise prefix routing: KV-event ingestion, and per request tokenising, hashing, matching.

* Ingestion: CPU per 1,000 KV events through the subscriber (msgpack decode, sequence check,
  index update), from vLLM-shaped batches of 16 events (BlockStored of 4 blocks with their 64
  token ids, BlockRemoved of 4 blocks), against msgspec's bare decode of the same payloads.
* Per request, a 2,000-token prompt: the token ids from a local tokenizer.json (a byte-level BPE
  trained here, 16k vocabulary) and from the simulator's POST /tokenize (a subprocess; wall time
  per call, one at a time), vLLM's block hashes (sha256_cbor and sha256; cold, and a prefix seen
  before, which the hasher memoises), and matching 125 blocks
  against 8 endpoints holding 50,000 blocks each; the approximate producer's xxhash chain of the
  same prompt is the baseline of the ratios (which count the memoised hashing: shared prefixes).

    python -m bench.precise_prefix [--quick]   # prints a table, writes bench/results/precise_prefix.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench.common import log, rnd, write_result
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.datalayer.kvevents.index import BlockIndex
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.datalayer.kvevents.tokens import LocalTokenizer, ServerTokenizer
from epp.director.prefix.hashing import hash_request
from epp.testing.builders import make_endpoint, make_request
from epp_sim.demo.procs import SimFleet
from epp_sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

SEED = 17
_TEXT = (
    "the of and to in is was for on that with as by at from his her they this which be are an or had not "
    "model cache token prefix block engine request server route replica event index latency policy system "
    "user assistant context document answer question summary report table value result figure method"
)
WORDS = _TEXT.split()


def corpus(rng: random.Random, words: int) -> str:
    return " ".join(
        rng.choice(WORDS) + (str(rng.randrange(100)) if rng.random() < 0.1 else "") for _ in range(words)
    )


def batches(rng: random.Random, n_events: int, per_batch: int = 16) -> list[bytes]:
    enc = msgspec.msgpack.Encoder()
    out = []
    events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    live: list[int] = []
    for _ in range(n_events):
        if live and rng.random() < 0.3:
            gone = [live.pop(rng.randrange(len(live))) for _ in range(min(4, len(live)))]
            events.append(BlockRemoved(block_hashes=gone, medium="GPU"))
        else:
            hashes = [rng.getrandbits(64) for _ in range(4)]
            live.extend(hashes)
            events.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=rng.getrandbits(64),
                    token_ids=[rng.randrange(32000) for _ in range(64)],
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                )
            )
        if len(events) == per_batch:
            out.append(enc.encode(KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0)))
            events = []
    return out


def cpu_us(fn: Callable[[], object], repeat: int) -> float:
    """Median CPU microseconds of fn() over `repeat` runs (process CPU time, not wall)."""
    samples = []
    for _ in range(repeat):
        t0 = time.process_time_ns()
        fn()
        samples.append((time.process_time_ns() - t0) / 1000)
    return statistics.median(samples)


def ingestion(rng: random.Random, n_events: int) -> dict[str, float]:
    payloads = batches(rng, n_events)
    events = len(payloads) * 16
    sub = KVEventSubscriber(SubscriberSettings(), BlockIndex(capacity=200_000))
    ep = make_endpoint(0)
    sub.add(ep)
    name = ep.metadata.name
    t0 = time.process_time()
    for seq, p in enumerate(payloads):
        sub.on_message(name, seq, p)
    applied = time.process_time() - t0
    decode = msgspec.msgpack.Decoder().decode
    t0 = time.process_time()
    for p in payloads:
        decode(p)
    bare = time.process_time() - t0
    per_1k = applied / events * 1000 * 1e6
    return {
        "events": events,
        "cpu_us_per_1k_events": per_1k,
        "bare_decode_us_per_1k_events": bare / events * 1000 * 1e6,
        "ratio_to_bare_decode": applied / bare,
        "core_share_at_10k_events_per_s": per_1k * 10 / 1e6,
    }


def local_tokenizer(rng: random.Random, tmp: Path) -> LocalTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=16_000, show_progress=False, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator((corpus(rng, 200) for _ in range(500)), trainer=trainer)
    path = tmp / "tokenizer.json"
    tok.save(str(path))
    return LocalTokenizer(str(path))


def prompt_of_tokens(rng: random.Random, encode: Callable[[str], list[int]], target: int) -> str:
    text = corpus(rng, target)
    while len(encode(text)) < target:
        text += " " + corpus(rng, 50)
    return text


async def server_tokenize_us(prompt: str, calls: int) -> tuple[float, float, int]:
    """(median wall µs per call, client CPU µs per call, token count) against a simulator subprocess."""
    async with SimFleet(1, "--max-model-len", "131072") as fleet:
        port = fleet.ports[0]
        ep = [make_endpoint(0, address="127.0.0.1", port=port)]
        server = ServerTokenizer()
        request = make_request(model="mock-model", prompt=prompt)
        try:
            ids = await server.token_ids(request, ep)  # connection warm-up
            assert ids is not None
            walls = []
            cpu0 = time.process_time()
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                await server.token_ids(request, ep)
                walls.append((time.perf_counter_ns() - t0) / 1000)
            cpu = (time.process_time() - cpu0) / calls * 1e6
        finally:
            await server.close()
    return statistics.median(walls), cpu, len(ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.precise_prefix", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rng = random.Random(SEED)
    repeat = 30 if args.quick else 200
    log("precise_prefix: ingestion")
    ingest = ingestion(rng, 20_000 if args.quick else 200_000)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log("precise_prefix: training a local BPE tokenizer")
        local = local_tokenizer(rng, Path(tmp))
        prompt = prompt_of_tokens(rng, local.encode, 2000)
        ids = local.encode(prompt)
        local_us = cpu_us(lambda: local.encode(prompt), repeat)
    log("precise_prefix: server /tokenize")
    sim_prompt = "x" * 8000  # the simulator's tokenizer: 4 characters per token, 2,000 tokens
    server_wall, server_cpu, server_tokens = asyncio.run(server_tokenize_us(sim_prompt, repeat))

    ids2k = ids[:2000]
    # cold: a new hasher each time (nothing memoised); warm: the prefix was hashed before
    hash_cbor = cpu_us(lambda: BlockHasher("sha256_cbor", 16, "42").hashes(ids2k, 256), repeat)
    hash_pickle = cpu_us(lambda: BlockHasher("sha256", 16, "42").hashes(ids2k, 256), repeat)
    cbor = BlockHasher("sha256_cbor", 16, "42")
    hashes = cbor.hashes(ids2k, 256)
    hash_warm = cpu_us(lambda: cbor.hashes(ids2k, 256), repeat)
    index = BlockIndex(capacity=60_000)
    for e in range(8):
        slot = index.add_endpoint(f"ep-{e}").slot
        held = hashes[: rng.randrange(len(hashes))] if e % 2 else []
        index.stored(slot, [*held, *(rng.getrandbits(64) for _ in range(50_000 - len(held)))])
    match_us = cpu_us(lambda: index.match(hashes, (1 << 8) - 1), repeat)
    approx_request = make_request(prompt=prompt)
    approx_us = cpu_us(lambda: hash_request(approx_request, 16, 256), repeat)

    per_request = {
        "prompt_tokens": len(ids2k),
        "local_tokenize_cpu_us": local_us,
        "server_tokenize_wall_us": server_wall,
        "server_tokenize_client_cpu_us": server_cpu,
        "server_tokens": server_tokens,
        "hash_sha256_cbor_us": hash_cbor,
        "hash_sha256_pickle_us": hash_pickle,
        "hash_memoised_prefix_us": hash_warm,
        "match_8_endpoints_us": match_us,
        "approx_hash_baseline_us": approx_us,
        "ratio_local_total_to_approx": (local_us + hash_warm + match_us) / approx_us,
        "ratio_server_cpu_total_to_approx": (server_cpu + hash_warm + match_us) / approx_us,
    }
    rows: list[tuple[str, Any]] = [
        ("ingestion: CPU µs per 1,000 events", rnd(ingest["cpu_us_per_1k_events"], 0)),
        ("  bare msgpack decode, µs per 1,000 events", rnd(ingest["bare_decode_us_per_1k_events"], 0)),
        ("  share of one core at 10,000 events/s", rnd(ingest["core_share_at_10k_events_per_s"], 4)),
        ("local tokenizer, 2,000 tokens: CPU µs", rnd(local_us, 0)),
        (
            "server /tokenize, 2,000 tokens: wall µs (client CPU µs)",
            f"{rnd(server_wall, 0)} ({rnd(server_cpu, 0)})",
        ),
        (
            "block hashes sha256_cbor / sha256 (pickle), 125 blocks: µs",
            f"{rnd(hash_cbor, 0)} / {rnd(hash_pickle, 0)}",
        ),
        ("  the same prefix again (memoised): µs", rnd(hash_warm, 0)),
        ("match 125 blocks over 8 endpoints: µs", rnd(match_us, 1)),
        ("approximate producer's hashing (baseline): µs", rnd(approx_us, 1)),
        ("local path / baseline", rnd(per_request["ratio_local_total_to_approx"], 1)),
        ("server path CPU / baseline", rnd(per_request["ratio_server_cpu_total_to_approx"], 1)),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    path = write_result(
        "precise_prefix",
        {"ingestion": ingest, "per_request": per_request},
        mode="quick" if args.quick else "full",
        seeds={"rng": SEED},
    )
    log(f"precise_prefix: wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
