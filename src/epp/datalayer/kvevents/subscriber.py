"""ZMQ SUB sockets feeding the ``BlockIndex``, with vLLM's sequence numbers checked.

Two modes, alone or together (llm-d's): one SUB per endpoint connecting to the engine's bound
PUB (pod discovery, ``socket_port`` or an explicit address), and *centralised*: one SUB the EPP
binds at ``zmq_endpoint`` that every engine connects to, its topic ``kv@<ip>[:<port>]@<model>``
naming the endpoint (``ip:port`` exactly, else the only endpoint with that address).  An engine
moving from one mode to the other is a new process: its sequence restarts, which is a restart
below, not an outage.

Per message ``[topic, seq (8 bytes big-endian), payload]``:

* ``seq == last + 1``: applied.  An endpoint marked inconsistent for a gap it could not replay or
  for silence becomes consistent again (nothing was lost since).
* ``seq > last + 1``: a gap (the PUB socket dropped batches at its high-water mark, or the
  connection broke).  Removals may be lost, so the index may hold blocks the engine evicted:
  the endpoint is inconsistent.  With a replay socket the missing batches are asked for (vLLM's
  ROUTER protocol) and applied in order, and the endpoint is consistent again; without one, or if
  the engine's buffer no longer has them, its blocks are dropped (they may be stale) and it is
  *rebuilding*: fresh events are indexed, but an engine reports a block once, when it first
  caches it, so the hot prefixes it already held never come back; the endpoint stays
  inconsistent (the scorer takes the larger of this index and the approximate one) until the
  engine's cache is known complete again: an ``AllBlocksCleared`` or an engine restart.
* ``seq < last + 1`` (outside a replayed range): the engine restarted.  Its cache is empty; the
  endpoint's blocks are dropped and indexing starts over from this batch.
* The first message, at any seq: applied.  Joining a stream late loses only stores (the index
  under-predicts), never removals, so it is consistent.
* A new stream (the first message on a (re)connected socket), an engine restart, a gap that could
  not be replayed (it may hide a restart) and every ``verify_interval`` begin a new verification
  round: the next root blocks are hashed again, so an engine that came back with another
  ``--prefix-caching-hash-algo`` or ``PYTHONHASHSEED`` (a rolling upgrade) is caught in the batch
  that shows it, not only the first blocks the EPP ever saw.  A restarted engine's earlier
  configuration mismatch no longer holds against it: it is checked afresh.
* ``AllBlocksCleared``: the endpoint's blocks are dropped; consistent from here (this ends rebuilding).
* A publisher silent for ``silence_timeout`` after its engine served a request the EPP routed to
  it that stores a block the index does not show it holding (``expect_events``: the scorer calls
  it at the first response byte, when the prefill is done and its BlockStored already published):
  inconsistent until its next contiguous batch.
* ``BlockStored.block_size`` other than the configured one, or a first block whose hash is not
  what the configured algorithm and seed give for its tokens: an error log, a metric, and the
  endpoint stays inconsistent until the engine restarts (a configuration error does not heal
  itself).  A failed hash check is logged and counted at once
  (``epp_kv_events_hash_checks_total{outcome="failed"}``); it is a mismatch at once when the
  engine sent its extra keys (newer vLLM: nothing unknown went into the hash), else after
  ``_MISMATCHES_TO_FAIL`` failures with no pass in the round (a cache_salt the events do not show
  fails one request's blocks, a wrong algorithm or seed fails every block).

Every consistency transition is a log line and ``epp_kv_events_consistency_transitions_total``
(labelled by its cause).

Everything runs on the event loop; decoding a batch is one msgspec call plus a loop over its
events (bench/precise_prefix.py measures the CPU per 1,000 events).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
import zmq
import zmq.asyncio

from epp.datalayer.api import Endpoint
from epp.datalayer.kvevents import metrics as m
from epp.datalayer.kvevents.hashing import BlockHasher
from epp.datalayer.kvevents.index import BlockIndex, EndpointState
from epp.datalayer.kvevents.wire import Batch, Cleared, Removed, Stored, WireError, decode_batch
from epp.errors import ConfigError

# ``--workers N``: one process can bind ``zmqEndpoint``.  Worker 0 binds it and republishes every
# message on ``bind:<ipc address>``; the other workers' centralised SUB connects there instead
# (``connect:<ipc address>``).  Set by epp.cli for each worker (docs/workers.md).
RELAY_ENV: Final = "EPP_KV_EVENTS_RELAY"

log = structlog.get_logger(__name__)

END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
_VERIFY_FIRST: Final = 8  # root blocks checked per endpoint before sampling
_VERIFY_EVERY: Final = 64  # then one root block in this many
_MISMATCHES_TO_FAIL: Final = 3  # failed checks, with none passed, that make a hash-scheme mismatch
_ANOTHER_ENGINE: Final = frozenset({"new stream", "engine restart", "unreplayed gap"})  # rounds that may
# face another engine process, so a mismatch found before no longer holds

PORT_LABEL: Final = "kv-events.epp/port"
REPLAY_PORT_LABEL: Final = "kv-events.epp/replay-port"
TOPIC_LABEL: Final = "kv-events.epp/topic"


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriberSettings:
    """Where each endpoint publishes and what its events must look like."""

    topic_filter: str = "kv@"
    socket_port: int = 5557  # llm-d's podDiscoveryConfig.socketPort: tcp://<endpoint address>:<port>
    replay_port: int = 0  # the engine's replay ROUTER port; 0: no replay
    endpoints: Mapping[str, str] = field(default_factory=dict)  # endpoint name or host:port → SUB address
    replay_endpoints: Mapping[str, str] = field(default_factory=dict)  # … → replay ROUTER address
    block_size: int = 16
    hasher: BlockHasher | None = None  # verifies root blocks' hashes when set
    silence_timeout: float = 3.0
    replay_timeout: float = 2.0
    verify_interval: float = 30.0  # seconds between verification rounds on a live stream
    zmq_endpoint: str = ""  # centralised mode: the EPP binds this SUB address, engines connect
    per_endpoint: bool = True  # one SUB per endpoint (pod discovery or the explicit map)


@dataclass(slots=True)
class _Round:
    """One verification round of an endpoint's stream: root blocks seen, checks passed and failed."""

    started: float
    cause: str
    seen: int = 0
    passed: int = 0
    failed: int = 0


def _address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class KVEventSubscriber:
    """The per-endpoint SUB loops, the index they feed and the silence watchdog."""

    def __init__(self, settings: SubscriberSettings, index: BlockIndex) -> None:
        self.settings = settings
        self.index = index
        self._context: zmq.asyncio.Context | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._endpoints: dict[str, Endpoint] = {}
        # endpoint → (events after this monotonic time satisfy it, the time by which they are due)
        self._expect: dict[str, tuple[float, float]] = {}
        self._replayed: dict[str, tuple[int, int]] = {}  # endpoint → seq range applied by replay
        self._rounds: dict[str, _Round] = {}  # endpoint → its current verification round
        self._fresh: set[str] = set()  # endpoints whose socket is new: the next message starts a stream
        self._watchdog: asyncio.Task[None] | None = None
        self._central: asyncio.Task[None] | None = None
        self._relay: zmq.asyncio.Socket | None = None  # worker 0 of --workers: republishes to siblings
        self.bound_endpoint = ""  # the centralised SUB's address once bound (port 0 resolved)
        self.unattributed = 0  # centralised messages whose topic named no endpoint
        self._unattributed_topics: set[bytes] = set()
        self._running = False
        self.on_change: Callable[[EndpointState], None] | None = None

    # lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._running:
            return
        self._context = zmq.asyncio.Context()
        self._running = True
        self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="kv-events:watchdog")
        if self.settings.zmq_endpoint:
            sock = self._bind_central()
            self._central = asyncio.get_running_loop().create_task(
                self._run_central(sock), name="kv-events:central"
            )
        for endpoint in list(self._endpoints.values()):
            self._spawn(endpoint)

    async def stop(self) -> None:
        self._running = False
        tasks = [*self._tasks.values(), *(t for t in (self._watchdog, self._central) if t is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._watchdog = None
        self._central = None
        if self._relay is not None:
            self._relay.close(linger=0)
            self._relay = None
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    # endpoints ----------------------------------------------------------------------------
    def add(self, endpoint: Endpoint) -> None:
        name = endpoint.metadata.name
        old = self._endpoints.get(name)
        self._endpoints[name] = endpoint
        if old is not None and old.metadata == endpoint.metadata and name in self._tasks:
            return
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        state = self.index.add_endpoint(name)
        m.KV_EVENT_CONSISTENT.labels(name).set(1 if state.consistent else 0)
        if self._running:
            self._spawn(endpoint)

    def remove(self, endpoint: Endpoint) -> None:
        name = endpoint.metadata.name
        self._endpoints.pop(name, None)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        self._expect.pop(name, None)
        self._replayed.pop(name, None)
        self._rounds.pop(name, None)
        self._fresh.discard(name)
        self.index.remove_endpoint(name)
        m.KV_INDEX_BLOCKS.set(len(self.index))
        # drop the endpoint's series: pods come and go, their label values must not pile up
        for family in (m.KV_EVENT_CONSISTENT, m.KV_EVENT_BATCHES, m.KV_EVENT_GAPS, m.KV_EVENT_RESTARTS):
            family.remove(name)
        for family in (m.KV_EVENT_DECODE_ERRORS, m.PRECISE_FALLBACKS, m.KV_EVENT_VERIFY_ROUNDS):
            family.remove(name)
        for outcome in ("passed", "failed"):
            m.KV_EVENT_HASH_CHECKS.remove(name, outcome)
        for cause in m.TRANSITION_CAUSES:
            m.KV_EVENT_TRANSITIONS.remove(name, "true", cause)
            m.KV_EVENT_TRANSITIONS.remove(name, "false", cause)
        for outcome in ("ok", "incomplete", "timeout"):
            m.KV_EVENT_REPLAYS.remove(name, outcome)
        for kind in ("block_size", "hash_scheme"):
            m.KV_EVENT_MISMATCHES.remove(name, kind)

    def address(self, endpoint: Endpoint) -> tuple[str, str | None, str]:
        """(SUB address, replay address or None, topic filter) for ``endpoint``: the explicit map
        by name or host:port first, then its labels, then ``socket_port`` on its address."""
        s = self.settings
        md = endpoint.metadata
        labels = md.labels
        topic = labels.get(TOPIC_LABEL, s.topic_filter)
        sub = s.endpoints.get(md.name) or s.endpoints.get(md.hostport)
        if sub is None:
            port = labels.get(PORT_LABEL)
            sub = _address(md.address, int(port) if port and port.isdigit() else s.socket_port)
        replay = s.replay_endpoints.get(md.name) or s.replay_endpoints.get(md.hostport)
        if replay is None:
            rport = labels.get(REPLAY_PORT_LABEL)
            port_number = int(rport) if rport and rport.isdigit() else s.replay_port
            replay = _address(md.address, port_number) if port_number > 0 else None
        return sub, replay, topic

    def expect_events(self, name: str, since: float, now: float) -> None:
        """``name``'s engine served a request routed at ``since`` that stores a block it did not
        hold: a batch after ``since`` is due by ``now + silence_timeout``.  Called at the first
        response byte (the prefill is done, so its BlockStored is already published), not at
        routing: a request queued in the engine longer than the timeout is not a silent publisher.
        The earliest outstanding expectation is kept."""
        if name not in self._endpoints or name in self._expect:
            return
        state = self.index.states.get(name)
        if state is not None and state.last_event_at > since:
            return  # a batch already came after the request was routed
        self._expect[name] = (since, now + self.settings.silence_timeout)

    def note_routed(self, name: str, now: float) -> None:
        """Events are due ``silence_timeout`` after ``now`` (``expect_events`` from routing)."""
        self.expect_events(name, now, now)

    # the loops ----------------------------------------------------------------------------
    def _spawn(self, endpoint: Endpoint) -> None:
        name = endpoint.metadata.name
        md = endpoint.metadata
        if (
            not self.settings.per_endpoint
            and md.name not in self.settings.endpoints
            and md.hostport not in self.settings.endpoints
        ):
            return  # centralised only: its engine publishes to the EPP's bound socket
        self._tasks[name] = asyncio.get_running_loop().create_task(
            self._run(endpoint), name=f"kv-events:{name}"
        )

    async def _run(self, endpoint: Endpoint) -> None:
        assert self._context is not None
        name = endpoint.metadata.name
        sub_address, replay_address, topic = self.address(endpoint)
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        try:
            sock.connect(sub_address)
            self._fresh.add(name)
            log.info(
                "kv_events_subscribed", endpoint=name, address=sub_address, topic=topic, replay=replay_address
            )
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self._decode_error(name, "not a [topic, seq, payload] message")
                    continue
                seq = int.from_bytes(frames[1], "big")
                gap_from = self.on_message(name, seq, frames[2])
                if gap_from is not None:
                    await self._recover(name, replay_address, gap_from, seq, frames[2])
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("kv_events_subscriber_failed", endpoint=name, error=str(e))
        finally:
            sock.close(linger=0)

    # centralised mode -------------------------------------------------------------------
    def _bind_central(self) -> zmq.asyncio.Socket:
        """Bind before start returns: a bad address is a startup error, and engines can connect."""
        assert self._context is not None
        s = self.settings
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, s.topic_filter.encode())
        mode, _, relay = os.environ.get(RELAY_ENV, "").partition(":")
        if mode == "connect":  # a sibling of worker 0, which owns the address
            sock.connect(relay)
            self.bound_endpoint = relay
            log.info("kv_events_central_relayed", relay=relay, endpoint=s.zmq_endpoint)
            return sock
        if mode == "bind":
            self._relay = self._context.socket(zmq.PUB)
            self._relay.setsockopt(zmq.LINGER, 0)
            self._relay.setsockopt(zmq.SNDHWM, 100_000)
            self._relay.bind(relay)
        try:
            sock.bind(s.zmq_endpoint)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            raise ConfigError(f"kvEventsConfig.zmqEndpoint {s.zmq_endpoint!r}: cannot bind: {e}") from e
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        self.bound_endpoint = last.decode() if isinstance(last, bytes) else str(last)
        log.info("kv_events_central_bound", address=self.bound_endpoint, topic=s.topic_filter)
        return sock

    def endpoint_for_topic(self, topic: bytes, payload: bytes = b"") -> str | None:
        """The endpoint a centralised message's topic names: ``kv@<who>@<model>`` where ``who`` is
        an endpoint's ``ip:port`` (or name), else an address only one endpoint has.  Several
        endpoints on the address (a pod's data-parallel ranks, llm-d's topic naming the pod IP
        only): the batch's ``data_parallel_rank`` picks the rank-th of them by port, the order
        the pool lists a pod's rank ports in."""
        parts = topic.decode(errors="replace").split("@")
        if len(parts) < 2 or not parts[1]:
            return None
        who = parts[1]
        same: list[tuple[int, str]] = []
        for name, ep in self._endpoints.items():
            md = ep.metadata
            if who in (md.hostport, md.name):
                return name
            if who.strip("[]") == md.address:
                same.append((md.port, name))
        if len(same) <= 1:
            return same[0][1] if same else None
        try:
            rank = decode_batch(payload).data_parallel_rank if payload else None
        except WireError:
            return None
        if rank is None or not 0 <= rank < len(same):
            return None
        return sorted(same)[rank][1]

    async def _run_central(self, sock: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frames = await sock.recv_multipart()
                if self._relay is not None:  # at the high-water mark PUB drops: a sibling sees a gap
                    self._relay.send_multipart(frames, flags=zmq.NOBLOCK)
                if len(frames) != 3 or len(frames[1]) != 8:
                    self._decode_error("central", "not a [topic, seq, payload] message")
                    continue
                name = self.endpoint_for_topic(frames[0], frames[2])
                if name is None:
                    self.unattributed += 1
                    if frames[0] not in self._unattributed_topics and len(self._unattributed_topics) < 64:
                        self._unattributed_topics.add(frames[0])
                        log.warning(
                            "kv_events_topic_unattributed",
                            topic=frames[0].decode(errors="replace"),
                            detail="no endpoint has the address the topic names (kv@<ip>[:<port>]@<model>), "
                            "or several do and the batch's data_parallel_rank does not pick one",
                        )
                    continue
                seq = int.from_bytes(frames[1], "big")
                gap_from = self.on_message(name, seq, frames[2])
                if gap_from is not None:
                    endpoint = self._endpoints.get(name)
                    replay = self.address(endpoint)[1] if endpoint is not None else None
                    await self._recover(name, replay, gap_from, seq, frames[2])
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("kv_events_central_failed", error=str(e))
        finally:
            sock.close(linger=0)

    def on_message(self, name: str, seq: int, payload: bytes, now: float | None = None) -> int | None:
        """Apply one live message; returns the first missing seq when there is a gap to recover
        (the message itself is then not applied yet)."""
        state = self.index.states.get(name)
        if state is None:
            return None
        now = time.monotonic() if now is None else now
        expected = state.last_seq + 1
        replayed = self._replayed.get(name)
        if replayed is not None:
            if replayed[0] <= seq <= replayed[1]:
                return None  # already applied from the replay
            del self._replayed[name]
        if name in self._fresh:
            self._fresh.discard(name)
            self._new_round(state, "new stream", now)
        if state.last_seq < 0 or seq == expected:
            self._apply(state, seq, payload, now, resume=True)
        elif seq > expected:
            state.gaps += 1
            m.KV_EVENT_GAPS.labels(name).inc()
            self._set(state, False, f"sequence gap: expected {expected}, got {seq}", now, cause="gap")
            return expected
        else:
            state.restarts += 1
            m.KV_EVENT_RESTARTS.labels(name).inc()
            log.warning("kv_events_engine_restarted", endpoint=name, last_seq=state.last_seq, seq=seq)
            self.index.clear(state.slot)
            state.rebuilding = False
            self._new_round(state, "engine restart", now)
            self._apply(state, seq, payload, now, resume=True, reason=f"engine restarted (seq {seq})")
        return None

    def _new_round(self, state: EndpointState, cause: str, now: float) -> None:
        """Verify the next root blocks afresh.  After a restart or on a new stream the engine may
        be another process with another configuration: an earlier mismatch no longer holds."""
        self._rounds[state.name] = _Round(now, cause)
        m.KV_EVENT_VERIFY_ROUNDS.labels(state.name).inc()
        if cause in _ANOTHER_ENGINE:
            state.mismatch = ""

    async def _recover(self, name: str, replay: str | None, first: int, seq: int, payload: bytes) -> None:
        """A gap [first, seq): replay it if possible, else drop the endpoint's blocks; then apply seq."""
        state = self.index.states.get(name)
        if state is None:
            return
        replayed: list[tuple[int, bytes]] | None = None
        if replay is not None:
            replayed = await self._replay(name, replay, first)
        now = time.monotonic()
        wanted = [(s, p) for s, p in (replayed or []) if first <= s]
        if replayed is not None and wanted and wanted[0][0] == first and wanted[-1][0] >= seq - 1:
            state.replays += 1
            m.KV_EVENT_REPLAYS.labels(name, "ok").inc()
            last = first - 1
            for s, p in wanted:
                if s > seq:
                    break
                self._apply(state, s, p, now, resume=False)
                last = s
            if last < seq:
                self._apply(state, seq, payload, now, resume=False)
                last = seq
            self._replayed[name] = (first, last)
            self._set(state, True, f"replayed {first}..{last}", now, cause="replayed")
            return
        if replay is not None:
            m.KV_EVENT_REPLAYS.labels(name, "incomplete" if replayed is not None else "timeout").inc()
        self.index.clear(state.slot)
        state.rebuilding = True
        self._new_round(state, "unreplayed gap", now)  # a restart can hide behind a forward jump
        self._set(state, False, f"gap {first}..{seq - 1} not replayable: rebuilding", now, cause="rebuilding")
        m.KV_INDEX_BLOCKS.set(len(self.index))
        self._apply(state, seq, payload, now, resume=False)
        log.warning("kv_events_gap_unrecovered", endpoint=name, missing_from=first, resumed_at=seq)

    async def _replay(self, name: str, address: str, first: int) -> list[tuple[int, bytes]] | None:
        assert self._context is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(address)
            async with asyncio.timeout(self.settings.replay_timeout):
                await sock.send_multipart((b"", first.to_bytes(8, "big")))
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) != 3:
                        continue
                    if frames[1] == END_SEQ:
                        return out
                    out.append((int.from_bytes(frames[1], "big"), frames[2]))
        except TimeoutError:
            log.warning("kv_events_replay_timeout", endpoint=name, address=address, first=first)
            return None
        finally:
            sock.close(linger=0)

    # applying -----------------------------------------------------------------------------
    def _apply(
        self, state: EndpointState, seq: int, payload: bytes, now: float, *, resume: bool, reason: str = ""
    ) -> None:
        name = state.name
        state.last_seq = seq
        state.last_event_at = now
        self._expect.pop(name, None)
        try:
            batch = decode_batch(payload)
        except WireError as e:
            self._decode_error(name, str(e))
            self._set(state, False, f"undecodable batch {seq}: {e}", now, cause="undecodable")
            return
        state.batches += 1
        m.KV_EVENT_BATCHES.labels(name).inc()
        clears = state.clears
        ok = self._index_batch(state, batch, now)
        cause = "restart" if reason else "in_sequence"
        if state.clears != clears:
            state.rebuilding = False  # the engine's cache is empty: everything from here is complete
            reason = reason or "engine cleared its cache"
            cause = "cleared"
        if ok and not state.mismatch and not state.rebuilding and (resume or reason):
            self._set(state, True, reason or "in sequence", now, cause=cause)
        m.KV_INDEX_BLOCKS.set(len(self.index))

    def _index_batch(self, state: EndpointState, batch: Batch, now: float) -> bool:
        index = self.index
        slot = state.slot
        block_size = self.settings.block_size
        state.events += len(batch.events)
        for ev in batch.events:
            if type(ev) is Stored:
                if ev.block_size != block_size:
                    self._mismatch(
                        state,
                        "block_size",
                        f"events have block_size {ev.block_size}, configured {block_size}",
                        now,
                    )
                    return False
                if ev.parent is None and not self._verify(state, ev, now):
                    return False
                index.stored(slot, ev.hashes)
            elif type(ev) is Removed:
                index.removed(slot, ev.hashes)
            elif type(ev) is Cleared:
                index.clear(slot)
                state.clears += 1
        return True

    def _verify(self, state: EndpointState, ev: Stored, now: float) -> bool:
        """Recompute sampled first blocks: the first ``_VERIFY_FIRST`` of each round, then one in
        ``_VERIFY_EVERY``.  The engine's own extra keys are used when it sends them (``extra_keys``,
        newer vLLM) and a failure is then a mismatch at once; without them a salted request cannot
        be checked, so a mismatch is declared only after ``_MISMATCHES_TO_FAIL`` failures with no
        pass in the round (a wrong algorithm or seed fails every block)."""
        hasher = self.settings.hasher
        if hasher is None or not ev.hashes:
            return True
        rnd = self._rounds.get(state.name)
        if rnd is None or now - rnd.started >= self.settings.verify_interval:
            self._new_round(state, "periodic" if rnd is not None else "first blocks", now)
            rnd = self._rounds[state.name]
        n = rnd.seen
        rnd.seen = n + 1
        if n >= _VERIFY_FIRST and n % _VERIFY_EVERY:
            return True
        tokens = ev.token_ids  # decoded only here, for the sampled blocks
        if len(tokens) < hasher.block_size:
            return True
        if ev.has_extra:
            extra = tuple(ev.first_extra) if isinstance(ev.first_extra, list) else None
        else:
            extra = (ev.lora_name,) if ev.lora_name else None
        expected = int.from_bytes(hasher.digest(None, tokens[: hasher.block_size], extra)[-8:], "big")
        if expected == ev.hashes[0]:
            state.verified += 1
            rnd.passed += 1
            m.KV_EVENT_HASH_CHECKS.labels(state.name, "passed").inc()
            return True
        state.verify_failures += 1
        rnd.failed += 1
        m.KV_EVENT_HASH_CHECKS.labels(state.name, "failed").inc()
        decisive = ev.has_extra or (not rnd.passed and rnd.failed >= _MISMATCHES_TO_FAIL)
        if not decisive:
            if rnd.failed == 1:
                log.error(
                    "kv_events_hash_check_failed",
                    endpoint=state.name,
                    round=rnd.cause,
                    event_hash=f"{ev.hashes[0]:#x}",
                    expected=f"{expected:#x}",
                    hash_algo=hasher.algo,
                    detail="a first block does not hash as configured: a cache_salt the events do "
                    "not show, or another --prefix-caching-hash-algo / PYTHONHASHSEED on the engine",
                )
            return True
        self._mismatch(
            state,
            "hash_scheme",
            f"a first block hashes to {ev.hashes[0]:#x} in the events, {expected:#x} with "
            f"hashAlgo {hasher.algo!r} and the configured hashSeed: check both against the engine's "
            "--prefix-caching-hash-algo and PYTHONHASHSEED",
            now,
        )
        return False

    def _mismatch(self, state: EndpointState, kind: str, detail: str, now: float) -> None:
        state.mismatches += 1
        state.mismatch = kind
        m.KV_EVENT_MISMATCHES.labels(state.name, kind).inc()
        if state.mismatches == 1 or state.mismatches % 1000 == 0:
            log.error(
                "kv_events_config_mismatch",
                endpoint=state.name,
                kind=kind,
                detail=detail,
                count=state.mismatches,
            )
        self.index.clear(state.slot)
        self._set(state, False, f"{kind} mismatch: {detail}", now, cause=f"{kind}_mismatch")

    def _decode_error(self, name: str, detail: str) -> None:
        m.KV_EVENT_DECODE_ERRORS.labels(name).inc()
        log.warning("kv_events_undecodable", endpoint=name, detail=detail)

    def _set(self, state: EndpointState, consistent: bool, reason: str, now: float, *, cause: str) -> None:
        """Record the state; a transition is a log line and a count by ``cause`` (a short label)."""
        if state.mark(consistent, reason, now):
            m.KV_EVENT_CONSISTENT.labels(state.name).set(1 if consistent else 0)
            m.KV_EVENT_TRANSITIONS.labels(state.name, "true" if consistent else "false", cause).inc()
            emit = log.info if consistent else log.warning
            emit(
                "kv_events_consistency",
                endpoint=state.name,
                consistent=consistent,
                cause=cause,
                reason=reason,
            )
            if self.on_change is not None:
                self.on_change(state)

    # silence ------------------------------------------------------------------------------
    def check_silence(self, now: float) -> None:
        """Mark endpoints inconsistent whose events are overdue."""
        for name, (since, due) in list(self._expect.items()):
            if now < due:
                continue
            del self._expect[name]
            state = self.index.states.get(name)
            if state is not None and state.last_event_at <= since:
                self._set(
                    state,
                    False,
                    f"silent publisher: no events for {self.settings.silence_timeout:g}s after its "
                    f"engine served a request (routed {now - since:.1f}s ago) that stores new blocks",
                    now,
                    cause="silence",
                )

    async def _watch(self) -> None:
        period = max(self.settings.silence_timeout / 4, 0.05)
        while True:
            await asyncio.sleep(period)
            self.check_silence(time.monotonic())

    def debug_state(self) -> dict[str, Any]:
        index = self.index
        return {
            "centralEndpoint": self.bound_endpoint or None,
            "unattributedMessages": self.unattributed,
            "indexedBlocks": len(index),
            "pendingBlocks": len(index.pending),
            "capacityPerEndpoint": index.capacity,
            "endpoints": {
                name: {
                    "hostport": ep.metadata.hostport
                    if (ep := self._endpoints.get(name)) is not None
                    else None,
                    "consistent": s.consistent,
                    "reason": s.reason,
                    "lastSeq": s.last_seq,
                    "blocks": index.blocks(s.slot),
                    "pendingBlocks": index.pending.blocks(s.slot),
                    "batches": s.batches,
                    "events": s.events,
                    "gaps": s.gaps,
                    "restarts": s.restarts,
                    "replays": s.replays,
                    "clears": s.clears,
                    "rebuilding": s.rebuilding,
                    "mismatches": s.mismatches,
                    "mismatch": s.mismatch or None,
                    "hashChecks": {"passed": s.verified, "failed": s.verify_failures},
                    "verifyRound": (
                        {
                            "cause": r.cause,
                            "ageSeconds": round(time.monotonic() - r.started, 1),
                            "rootBlocks": r.seen,
                            "passed": r.passed,
                            "failed": r.failed,
                        }
                        if (r := self._rounds.get(name)) is not None
                        else None
                    ),
                    "eventsDue": (
                        {
                            "routedSecondsAgo": round(time.monotonic() - e[0], 2),
                            "dueInSeconds": round(e[1] - time.monotonic(), 2),
                        }
                        if (e := self._expect.get(name)) is not None
                        else None
                    ),
                    "transitions": [{"consistent": c, "reason": r} for _, c, r in s.transitions[-4:]],
                }
                for name, s in sorted(index.states.items())
            },
        }
