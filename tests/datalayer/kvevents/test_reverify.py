"""Issue 29: hash verification starts over on every new stream, engine restart and periodically,
so a restart under another hash algorithm or seed is caught in the batch that shows it; a
publisher silent while its engine serves is inconsistent within the configured time; every
consistency transition is counted by cause."""

from __future__ import annotations

from epp.datalayer.kvevents import metrics as m
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.datalayer.kvevents.index import BlockIndex, EndpointState
from epp.datalayer.kvevents.subscriber import KVEventSubscriber, SubscriberSettings
from epp.testing.builders import make_endpoint
from epp_sim.kv_events import BlockStored
from tests.datalayer.kvevents.test_subscriber import HASHER, NAME, payload

OTHER_ALGO = BlockHasher("sha256", 16, "42")  # pickle instead of CBOR: a rolling upgrade's engine
OTHER_SEED = BlockHasher("sha256_cbor", 16, "7")


def fresh(**settings: object) -> KVEventSubscriber:
    sub = KVEventSubscriber(SubscriberSettings(hasher=HASHER, **settings), BlockIndex(10_000))  # type: ignore[arg-type]
    sub.add(make_endpoint(0))
    return sub


def root(hasher: BlockHasher, n: int, *, extra: bool = True) -> BlockStored:
    """A request's first two blocks as ``hasher``'s engine stores them (``extra``: newer vLLM sends
    every block's extra keys, None for a plain request)."""
    tokens = [n * 1000 + t for t in range(32)]
    return BlockStored(
        block_hashes=hasher.hashes(tokens),
        parent_block_hash=None,
        token_ids=tokens,
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None, None] if extra else None,
    )


def consistent(state: EndpointState) -> bool:
    """Read through a call: mypy would narrow the attribute across the test's steps."""
    return state.consistent


def checks(outcome: str) -> float:
    return m.KV_EVENT_HASH_CHECKS.labels(NAME, outcome).value


def test_restart_under_another_algorithm_is_a_mismatch_in_its_first_batch() -> None:
    """The bug of issue 29: hundreds of root blocks verified before a restart, and the restarted
    engine's sha256 hashes against a sha256_cbor config were never checked."""
    sub = fresh()
    state = sub.index.states[NAME]
    for seq in range(200):
        sub.on_message(NAME, seq, payload(root(HASHER, seq)), now=float(seq) / 100)
    assert consistent(state) and state.verified >= 8 and state.verify_failures == 0
    failed = checks("failed")
    sub.on_message(NAME, 0, payload(root(OTHER_ALGO, 500)), now=3.0)  # seq back to 0: a new process
    assert state.restarts == 1
    assert checks("failed") == failed + 1
    assert not consistent(state) and state.mismatch == "hash_scheme"
    assert "hash_scheme mismatch" in state.reason
    assert m.KV_EVENT_TRANSITIONS.labels(NAME, "false", "hash_scheme_mismatch").value >= 1
    sub.on_message(NAME, 1, payload(root(OTHER_ALGO, 501)), now=3.1)
    assert not consistent(state)  # a configuration error does not heal while the engine runs


def test_a_restart_with_the_right_scheme_heals_a_mismatch() -> None:
    sub = fresh()
    state = sub.index.states[NAME]
    sub.on_message(NAME, 0, payload(root(OTHER_SEED, 1)), now=1.0)
    assert not consistent(state) and state.mismatch == "hash_scheme"
    sub.on_message(NAME, 0, payload(root(HASHER, 2)), now=2.0)  # restarted with the right seed
    assert consistent(state) and state.mismatch == "" and state.mismatches == 1
    assert state.reason == "engine restarted (seq 0)"


def test_without_extra_keys_the_first_failure_is_loud_and_three_make_a_mismatch() -> None:
    """Older vLLM sends no extra keys: one failure may be a cache_salt, so it is logged and counted
    at once, and only three in a round with no pass make the endpoint inconsistent."""
    sub = fresh()
    state = sub.index.states[NAME]
    for seq in range(20):
        sub.on_message(NAME, seq, payload(root(HASHER, seq, extra=False)), now=1.0)
    failed = checks("failed")
    sub.on_message(NAME, 0, payload(root(OTHER_SEED, 100, extra=False)), now=2.0)  # restart
    assert checks("failed") == failed + 1  # within the batch that shows it
    assert consistent(state)  # the passes before the restart do not count for the new engine...
    sub.on_message(NAME, 1, payload(root(OTHER_SEED, 101, extra=False)), now=2.1)
    sub.on_message(NAME, 2, payload(root(OTHER_SEED, 102, extra=False)), now=2.2)
    assert not consistent(state) and state.mismatch == "hash_scheme"  # ...so three failures decide


def test_a_new_stream_and_the_interval_start_new_rounds() -> None:
    sub = fresh(verify_interval=10.0)
    state = sub.index.states[NAME]
    rounds = m.KV_EVENT_VERIFY_ROUNDS.labels(NAME).value
    for seq in range(100):  # past the first 8, one root in 64 is checked
        sub.on_message(NAME, seq, payload(root(HASHER, seq)), now=1.0)
    assert m.KV_EVENT_VERIFY_ROUNDS.labels(NAME).value == rounds + 1
    passed = state.verified
    assert passed == 8 + 1  # roots 0..7 and 64
    # periodic: past the interval, the next roots are checked again (a seed change without a
    # visible restart, e.g. the first batches of a new process lost before the EPP connected)
    sub.on_message(NAME, 100, payload(root(OTHER_SEED, 100)), now=11.5)
    assert m.KV_EVENT_VERIFY_ROUNDS.labels(NAME).value == rounds + 2
    assert not consistent(state) and state.mismatch == "hash_scheme"
    # a new socket (the subscription was re-established): its first message starts a round and
    # forgets the old mismatch (it may be another engine process)
    sub._fresh.add(NAME)
    sub.on_message(NAME, 101, payload(root(HASHER, 101)), now=12.0)
    assert m.KV_EVENT_VERIFY_ROUNDS.labels(NAME).value == rounds + 3
    assert consistent(state) and state.verified == passed + 1


def test_silence_counts_only_events_after_the_request_was_routed() -> None:
    sub = fresh(silence_timeout=2.0)
    state = sub.index.states[NAME]
    sub.on_message(NAME, 0, payload(root(HASHER, 0)), now=10.0)
    # routed at 9.0, before that batch: the batch already answers it, nothing is due
    sub.expect_events(NAME, 9.0, 10.5)
    sub.check_silence(20.0)
    assert consistent(state)
    # routed at 11.0, served at 14.0 (it queued 3 s in the engine: no silence for that), due by 16.0
    sub.expect_events(NAME, 11.0, 14.0)
    sub.check_silence(15.9)
    assert consistent(state)
    silences = m.KV_EVENT_TRANSITIONS.labels(NAME, "false", "silence").value
    sub.check_silence(16.0)
    assert not consistent(state) and state.reason.startswith("silent publisher")
    assert m.KV_EVENT_TRANSITIONS.labels(NAME, "false", "silence").value == silences + 1
    sub.on_message(NAME, 1, payload(root(HASHER, 1)), now=16.5)  # the next contiguous batch
    assert consistent(state)
    assert m.KV_EVENT_TRANSITIONS.labels(NAME, "true", "in_sequence").value >= 2
    # a batch between routing and the deadline satisfies it
    sub.expect_events(NAME, 17.0, 17.5)
    sub.on_message(NAME, 2, payload(root(HASHER, 2)), now=18.0)
    sub.check_silence(30.0)
    assert consistent(state)
    debug = sub.debug_state()["endpoints"][NAME]
    assert debug["verifyRound"]["cause"] == "first blocks" and debug["eventsDue"] is None
    assert [t["consistent"] for t in debug["transitions"]] == [True, False, True]


def test_removed_endpoint_drops_the_new_series() -> None:
    sub = fresh(silence_timeout=1.0)
    sub.on_message(NAME, 0, payload(root(HASHER, 0)), now=1.0)
    sub.note_routed(NAME, 2.0)
    sub.check_silence(3.5)
    assert (NAME, "false", "silence") in dict(m.KV_EVENT_TRANSITIONS._series())
    sub.remove(make_endpoint(0))
    series = [
        *m.KV_EVENT_TRANSITIONS._series(),
        *m.KV_EVENT_HASH_CHECKS._series(),
        *m.KV_EVENT_VERIFY_ROUNDS._series(),
    ]
    assert not [k for k, _ in series if k[0] == NAME]
