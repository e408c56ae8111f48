"""``SyncHub``: moves every ``Replicated`` plugin's deltas between active-active replicas.

Why batch: a request changes several plugins' state (in-flight load, prefix insertions, a
session binding), and every message costs the sender a write per peer and each peer a
read, a decode, an apply and often a wake of its event loop — on a loaded machine a wake
costs more than the batch it carries (bench/scaleout, part cost).  So a plugin records a
change with a dict insert and calls ``dirty()``; the hub drains every plugin in the wake of
the next change (or ``hold`` after the first, or at once when holding keeps buying nothing)
and at most once per ``gap`` (``dirty``), and publishes one message holding all of it,
stamped with the first change's wall clock.  Plugins that do
not say when they change are drained on a short cadence (``poll``) instead; every shipped
plugin says so, and then the tick only sends heartbeats and checks liveness.  Receiving
runs in the loop's reader callback (``ZmqTransport.listen``): no task or event per
message, at most one read per ``read_gap`` while peers keep sending (unless what it read was
already older than ``read_budget``: then at once), and a read whenever the hub sends or the
ext_proc edge reads a request (``ZmqTransport.ride``, wired by the app): the loop is awake
anyway, and while it routes often enough the read timer never fires.  ``interval`` > 0 (llm-d's
``crossReplicaSyncInterval``) caps it at one batch per interval instead.

What the hub keeps per peer is only its sequence number and when it was last heard.  A
peer silent for ``timeout`` is ``forget``-ed in every plugin, so its in-flight counts
cannot outlive it.  Deltas are idempotent per key, but a lost one is repaired only when its key
changes again (a long request's in-flight count may not for minutes), so when a peer's messages
were lost (a gap in its sequence), it went silent, or it is heard for the first time, the next
batch asks it to resend (``wire.RESYNC``): it marks its counts (``resend``) and its next batch
carries them whole.  A replica that stops cleanly says goodbye
(``wire.GOODBYE``) and its peers forget it at once.  With peers configured and none heard,
the replica is partitioned: it keeps routing on its own view, says so once in the log and
in ``epp_sync_partitioned``.

Warm start: ``start`` asks a serving peer for ``{sync_key: snapshot}`` and restores it
before ``serving`` turns true (the app's readiness waits for it); messages that arrive
meanwhile wait in the SUB queue and are applied after the restore.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from epp.plugin.replicated import Replicated
from epp.sync import metrics
from epp.sync.api import Frames, Transport
from epp.sync.peers import Peer, PeerSource
from epp.sync.secret import PeerSecret
from epp.sync.transport import REQUEST_MAX_BYTES, SNAPSHOT_MAX_BYTES
from epp.sync.wire import (
    GOODBYE,
    RESYNC,
    WireError,
    decode_batch,
    decode_reply,
    decode_request,
    encode,
    encode_batch,
)

log = structlog.get_logger(__name__)

# Drain cadence for plugins that do not call dirty(): staleness ≤ 5 ms + transit, at most
# 200 batches a second per replica (bench/sync_lag.py: p99 7.7 ms on loopback).
DEFAULT_POLL: Final = 0.005
# Least time between two batches sent (dirty) and two reads of the SUB while busy
# (transport.listen); both add at most their value to staleness (bench/scaleout, part cost).
DEFAULT_HOLD: Final = 0.003
DEFAULT_COALESCE: Final = 0.003
# A batch waiting for the gap leaves in the first wake with a change once the gap has passed;
# its timer, the fallback when no such wake comes, fires this much after the gap (SyncHub.dirty).
GAP_SLACK: Final = 0.001
# The gap when every peer is a worker of this pod (``--workers``): the workers share the pod's
# cores, so a message costs the pod twice (a write here, a read and often a wake there) on the
# cores its requests need; at capacity, where the gap binds, 6 ms halves the sync messages (the
# pod's CPU per request was lower in 6 of 7 alternating rounds, median -3%; docs/decisions.md,
# "Workers as cheaper peers").
SIBLING_COALESCE: Final = 0.006
DEFAULT_READ_GAP: Final = 0.003
# A batch older than this when read has spent the staleness budget (the hold's 3 ms and more:
# a late release, a busy or descheduled loop): the busy receiver stops waiting ``read_gap``
# for the next ones and reads at once (``ZmqTransport.prompt``), so the planned waits do not
# stack on a delay the machine already made (goal: p99 <= 10 ms, decision -> applied).
DEFAULT_READ_BUDGET: Final = 0.004
# Held batches in a row that may leave on the hold timer (nothing joined them) before the
# hub stops holding (SyncHub.dirty).
HOLD_CREDIT: Final = 3
# Least time between two resends of this replica's counts: a peer whose messages keep being
# lost (a full queue) is not answered with a full resend per batch, which would add to what
# overflows; a request within it is answered when it ends.
RESYNC_EVERY: Final = 0.5
HEARTBEAT: Final = 0.1
DEFAULT_TIMEOUT: Final = 1.0
WARM_START_TIMEOUT: Final = 2.0
COLD_PEER_GRACE: Final = 0.3  # after a peer says it is warming up too, how long to look for a warm one
FORGET_AFTER: Final = 60.0  # a silent origin's bookkeeping is dropped after this long
# How long closing may wait for the goodbye (and the last batch) to leave: a bounded pause of the
# loop at shutdown, against every peer counting this replica's in-flight requests for ``timeout``.
GOODBYE_LINGER: Final = 0.2


@dataclass(slots=True)
class HubStats:
    """This hub's counts (the metrics are process-wide; tests run several hubs in one process)."""

    sent: int = 0
    received: int = 0
    bytes_sent: int = 0  # of the batches sent (once each, however many peers it went to)
    bytes_received: int = 0  # of the batches received and applied
    dropped: int = 0
    forgotten: int = 0
    timer_flushes: int = 0  # batches a timer sent (a wake of their own, unless the loop was awake)
    holds_joined: int = 0  # held batches a later wake's change sent (no timer wake)
    gaps_joined: int = 0  # batches that waited for the gap and left in a later change's wake
    goodbyes: int = 0  # peers that said they stopped (forgotten at once)
    resyncs_asked: int = 0  # peers asked to resend their counts (lost messages, silence, first heard)
    resends: int = 0  # times this replica resent its counts whole (a peer asked)
    rejected: dict[str, int] = field(default_factory=dict)


class SyncHub:
    """Drains, sends, receives and applies; see the module docstring."""

    def __init__(
        self,
        replica_id: str,
        transport: Transport,
        *,
        interval: float = 0.0,
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat: float = HEARTBEAT,
        poll: float = DEFAULT_POLL,
        coalesce: float = DEFAULT_COALESCE,
        sibling: Callable[[Peer], bool] | None = None,
        sibling_coalesce: float = SIBLING_COALESCE,
        hold: float = DEFAULT_HOLD,
        gap_slack: float = GAP_SLACK,
        read_gap: float = DEFAULT_READ_GAP,
        read_budget: float = DEFAULT_READ_BUDGET,
        warm_start_timeout: float = WARM_START_TIMEOUT,
        wall: Callable[[], float] = time.time,
        secret: PeerSecret | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.transport = transport
        self.secret = secret  # a snapshot request must present one of its secrets (None: any may ask)
        self._warned_unauthenticated = False
        self.interval = interval
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.poll = interval if interval > 0 else poll
        self.gap = interval if interval > 0 else coalesce  # least time between two batches sent
        self._coalesce = self.gap
        # a peer that is a worker of this pod (None: none is); with only such peers the gap is
        # ``sibling_coalesce`` (``interval``, when set, wins)
        self._sibling = sibling
        self._sibling_coalesce = sibling_coalesce if interval <= 0 else self.gap
        self.hold = 0.0 if interval > 0 else hold  # a change waits this long for the next ones
        self.gap_slack = gap_slack  # how long after the gap a waiting batch's timer fires
        self.read_gap = read_gap  # least time between two reads while peers keep sending
        self.read_budget = read_budget  # a batch this old when read: read the next ones at once
        self.warm_start_timeout = warm_start_timeout
        self._wall = wall
        self.stats = HubStats()
        self.serving = False  # warm start done: the app may report ready
        self.partitioned = False
        self.restored_from = ""  # the peer whose snapshot this replica started from
        self._plugins: dict[str, Replicated] = {}
        self._seq = 0
        self._last_sent = 0.0
        self._last_flush = 0.0
        self._scheduled: asyncio.Handle | asyncio.TimerHandle | None = None
        self._gap_due = 0.0  # loop time the gap of the batch waiting on its timer ends (0: none waits)
        self._dirty_at = 0.0  # wall clock of the first change not yet sent (0: none)
        self._holding = False  # the scheduled batch waits for a later wake's change (``hold``)
        self._same_wake = False  # the loop has not yet finished the wake that scheduled the batch
        self._sent_unheld = False  # the last batch left in its first change's wake, unheld
        self._hold_credit = HOLD_CREDIT  # hold timers that may still expire unjoined before holding stops
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_seq: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._silent: set[str] = set()
        self._started_at = 0.0
        self._cold_until: float | None = None
        self._gauges = (-1, -1)
        self._tasks: list[asyncio.Task[None]] = []
        self._failing: set[str] = set()  # keys whose drain/apply raised (logged once)
        self.ticks = 0  # cadence ticks run (tests wait on it instead of sleeping)
        self._polled = True
        self._self_listed = 0  # 1 once our own messages came back: one configured peer is us
        self._resync_wanted: set[str] = set()  # peers the next batch asks to resend (RESYNC)
        self._resent_at = -RESYNC_EVERY  # loop time of this replica's last resend
        self._resend_timer: asyncio.TimerHandle | None = None  # a resend put off by RESYNC_EVERY

    # --- plugins -----------------------------------------------------------------------
    @property
    def plugins(self) -> dict[str, Replicated]:
        return dict(self._plugins)

    def bind(self, plugins: Iterable[Any]) -> None:
        """Share these plugins' state (the ``Replicated`` ones); called at startup and on each reload.

        A key that survives a reload as a new instance takes over the old instance's view
        (``restore(old.snapshot())``), so what peers taught it is kept; the old instance's
        undrained local changes are sent first.
        """
        new: dict[str, Replicated] = {}
        for plugin in plugins:
            if not isinstance(plugin, Replicated) or getattr(plugin, "replicated", True) is False:
                continue  # not shareable, or configured not to share (syncCrossReplicaState: false)
            key = plugin.sync_key
            if key in new:
                log.warning("sync_duplicate_key", key=key, kept=str(new[key]), ignored=str(plugin))
                continue
            new[key] = plugin
        if self._plugins and self._tasks:
            self.flush()
        bound = {id(p) for p in self._plugins.values()}
        for key, plugin in new.items():
            if id(plugin) in bound:
                continue
            old = self._plugins.get(key)
            if old is not None:
                try:
                    plugin.restore(old.snapshot())
                except Exception:
                    log.exception("sync_rebind_restore_failed", key=key)
            # A plugin records its changes from its first drain on (replicated.py): this one
            # starts it, before any request, and drops what a restore may have recorded.
            self._drain(key, plugin)
        for plugin in new.values():
            if hasattr(plugin, "sync_dirty"):  # opt-in: drain at the end of the tick it changed in
                setattr(plugin, "sync_dirty", self.dirty)  # noqa: B010 - not part of the Protocol
        # Only plugins that do not say when they change need the fast drain cadence; without
        # them the tick runs for heartbeats and liveness only (an idle hub costs ~0.2% of a
        # core instead of ~2%).
        self._polled = any(not hasattr(p, "sync_dirty") for p in new.values())
        self._plugins = new

    # --- sending -----------------------------------------------------------------------
    def dirty(self) -> None:
        """A plugin has local changes: drain once, soon (see below), stamped with the first change's time.

        Every message costs each peer a read, a decode and an apply in a wake of its own, and
        this replica a write per peer, so changes are coalesced without adding wakes here:

        * A change less than ``gap`` after the previous batch waits for the gap: a busy replica
          sends at most 1/``gap`` batches a second.  The batch leaves at the end of the first
          wake with a change once the gap has passed (a busy replica changes something every
          request), and on its own timer ``gap_slack`` later only when no such wake came: a
          timer's wake of an otherwise idle loop costs more than the batch.
        * Otherwise the batch is *held* for the changes of the next wake that makes one (a
          request's release when the response is quick, the next request), at most ``hold``:
          that change sends it at the end of its own wake, so holding costs no timer wake when
          it pays.  When the hold expires on its timer instead (responses slower than ``hold``,
          a quiet replica), the timer's wake was wasted: after ``HOLD_CREDIT`` such misses in a
          row the hub stops holding and sends at the end of the change's own wake (no timer at
          all), and takes holding up again once a change follows a sent batch within ``hold``
          from a later wake (a hold would have merged them).

        The batch's time is the wall clock of its first change, so the lag peers observe
        (``epp_sync_delta_lag_seconds``) is the issue's staleness, decision → counted,
        coalescing included.
        """
        if self._scheduled is not None:
            if self._holding and not self._same_wake:
                # a change from a later wake than the first: it rides along, and the batch
                # goes at the end of this wake, saving the hold timer's wake
                self._holding = False
                self._hold_credit = HOLD_CREDIT
                self.stats.holds_joined += 1
                self._send_at_wake_end(self._scheduled)
            elif self._gap_due and self._loop_or_running().time() >= self._gap_due:
                # the gap has passed and the loop is awake for this change: the batch goes at
                # the end of this wake instead of on its timer's own
                self._gap_due = 0.0
                self.stats.gaps_joined += 1
                self._send_at_wake_end(self._scheduled)
            return
        if not self._tasks or not self.transport.has_peers:
            return  # nobody to tell soon: the tick drains (a peer that lists us hears it then)
        self._dirty_at = self._wall()
        loop = self._loop_or_running()
        now = loop.time()
        since = now - self._last_flush
        if self._sent_unheld:
            self._sent_unheld = False
            if since < self.hold and not self._same_wake:
                self._hold_credit = HOLD_CREDIT  # a hold would have merged this change: hold again
        if since < self.gap:
            self._gap_due = self._last_flush + self.gap
            self._scheduled = loop.call_later(self.gap - since + self.gap_slack, self._on_timer)
        elif self.hold > 0 and self._hold_credit > 0:
            self._holding = True
            self._mark_wake(loop)
            self._scheduled = loop.call_later(self.hold, self._on_timer)
        else:
            self._sent_unheld = True
            self._mark_wake(loop)
            self._scheduled = loop.call_soon(self.flush)

    def _send_at_wake_end(self, waiting: asyncio.Handle | asyncio.TimerHandle) -> None:
        """The batch ``waiting`` on a timer leaves at the end of this wake instead."""
        waiting.cancel()
        self._scheduled = self._loop_or_running().call_soon(self.flush)

    def _loop_or_running(self) -> asyncio.AbstractEventLoop:
        return self._loop or asyncio.get_running_loop()

    def _mark_wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """``_same_wake`` is true until the loop has run what this wake scheduled (call_soon
        runs after the wake's callbacks, before the next wait for I/O)."""
        self._same_wake = True
        loop.call_soon(self._wake_ended)

    def _wake_ended(self) -> None:
        self._same_wake = False

    def _on_timer(self) -> None:
        self.stats.timer_flushes += 1
        if self._holding:  # nothing followed within hold: the timer's wake bought nothing
            self._holding = False
            self._hold_credit -= 1
        self.flush()

    def flush(self) -> None:
        """Drain every plugin and publish what they had as one batch."""
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        self._holding = False
        self._gap_due = 0.0
        self._last_flush = asyncio.get_running_loop().time()
        batch: dict[str, list[Any]] = {}
        for key, plugin in self._plugins.items():
            if deltas := self._drain(key, plugin):
                batch[key] = deltas
        if self._resync_wanted:
            batch[RESYNC] = sorted(self._resync_wanted)
            self._resync_wanted.clear()
        first, self._dirty_at = self._dirty_at, 0.0
        if batch:
            self._publish(batch, first)
        if self.serving:
            self.transport.read_now()  # awake anyway: peers' messages too, saving the reader a wake

    def _drain(self, key: str, plugin: Replicated) -> list[Any]:
        try:
            return plugin.drain()
        except Exception:
            self._fail_once("sync_drain_failed", key)
            return []

    def _publish(self, batch: dict[str, list[Any]], first: float = 0.0) -> None:
        self._seq += 1
        try:
            frame = encode_batch(self.replica_id, self._seq, first or self._wall(), batch)
        except (TypeError, ValueError, OverflowError):
            log.exception("sync_encode_failed", keys=sorted(batch))
            return
        self._last_sent = asyncio.get_running_loop().time()
        if not self.transport.send(frame):
            self.stats.dropped += 1
            metrics.DROPPED.inc()
        elif batch:
            self.stats.sent += 1
            self.stats.bytes_sent += len(frame)
            metrics.BATCHES_SENT.inc()
            metrics.BATCH_BYTES_SENT.inc(len(frame))

    # --- receiving ---------------------------------------------------------------------
    def on_frames(self, frames: Frames) -> None:
        """One message from a peer's PUB: counted and ignored unless it is a well-formed batch."""
        self.on_messages([frames])

    def on_messages(self, messages: list[Frames]) -> None:
        """Every message one wake of the reader found, applied in order; the counters once per wake.

        A peer's message must never stop this replica from listening: whatever one raises
        is counted (``apply``) and logged once per plugin, and the rest are still applied.
        """
        now = self._loop.time() if self._loop is not None else asyncio.get_running_loop().time()
        wall = self._wall()
        lag = metrics.DELTA_LAG.observe
        applied = 0
        size = 0
        oldest = 0.0
        for frames in messages:
            try:
                sent_at = self._one(frames, now)
            except Exception:
                self._reject("apply")
                log.exception("sync_receive_failed")
                continue
            if sent_at is not None:
                applied += 1
                for frame in frames:
                    size += len(frame)
                age = wall - sent_at
                if age > oldest:
                    oldest = age
                lag(max(0.0, age))
        if oldest > self.read_budget:
            self.transport.prompt()  # late already: do not wait a read gap for the next ones
        if applied:
            self.stats.received += applied
            self.stats.bytes_received += size
            metrics.BATCHES_RECEIVED.inc(applied)
            metrics.BATCH_BYTES_RECEIVED.inc(size)

    def _one(self, frames: Frames, now: float) -> float | None:
        """Apply one message; its send time when it was a batch with deltas, else None."""
        try:
            sender, seq, sent_at, batch = decode_batch(frames, self.transport.max_message_bytes)
        except WireError as e:
            self._reject(e.reason)
            return None
        if sender == self.replica_id:
            self._self_listed = 1  # our own address was in the list under another name
            return None
        last = self._last_seq.get(sender)
        lost = last is None  # never heard (or forgotten): what it sent before is not here
        if last is not None:
            if seq > last + 1:
                self.stats.dropped += seq - last - 1
                metrics.DROPPED.inc(seq - last - 1)
                lost = True
            elif seq <= last:  # the peer restarted under the same id: its old counts are gone
                self._forget(sender, "restarted")
                lost = True
        self._last_seq[sender] = seq
        first = sender not in self._last_seen
        self._last_seen[sender] = now
        if sender in self._silent:
            self._silent.discard(sender)
            log.info("sync_peer_returned", peer=sender)
            first = lost = True  # its counts were forgotten: only the changed ones came back
        if first:  # the gauges say so now, not at the next tick
            self.check_peers()
        if lost:
            self._ask_resync(sender)
        if not batch:
            return None  # a heartbeat
        plugins = self._plugins
        for key, deltas in batch.items():
            plugin = plugins.get(key)
            if plugin is None:
                if key == GOODBYE:
                    self._goodbye(sender)
                    continue
                if key == RESYNC:
                    if self.replica_id in deltas:
                        self._resend()
                    continue
                self._reject("unknown_key")
                continue
            try:
                plugin.apply(sender, deltas)
            except Exception:
                self._reject("apply")
                self._fail_once("sync_apply_failed", key, peer=sender)
        return sent_at

    # --- repairing losses -----------------------------------------------------------------
    def _ask_resync(self, origin: str) -> None:
        """Ask ``origin`` (in this replica's next batch) to resend its counts whole: deltas are
        idempotent per key, but a lost one is repaired only when that key changes again, and a
        long request's in-flight count may not change for minutes.  Asking costs a few bytes of
        one batch; the sender bounds what answering costs (``_resend``)."""
        if origin not in self._resync_wanted:
            self._resync_wanted.add(origin)
            self.stats.resyncs_asked += 1
            self.dirty()

    def _resend(self) -> None:
        """A peer lost messages of ours: mark every plugin's counts (``resend``, where it has one:
        absolute per-key state; additive ones such as prefix insertions have none) so the next
        batch carries them whole; at most once per ``RESYNC_EVERY``, the latest request honoured."""
        loop = self._loop_or_running()
        wait = self._resent_at + RESYNC_EVERY - loop.time()
        if wait > 0:
            if self._resend_timer is None:
                self._resend_timer = loop.call_later(wait, self._resend_now)
            return
        self._resend_now()

    def _resend_now(self) -> None:
        self._resend_timer = None
        self._resent_at = self._loop_or_running().time()
        for key, plugin in self._plugins.items():
            resend = getattr(plugin, "resend", None)
            if resend is None:
                continue
            try:
                resend()
            except Exception:
                self._fail_once("sync_resend_failed", key)
        self.stats.resends += 1
        self.dirty()

    def _reject(self, reason: str) -> None:
        self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
        metrics.REJECTED.labels(reason).inc()

    def _fail_once(self, event: str, key: str, **kw: Any) -> None:
        if key not in self._failing:
            self._failing.add(key)
            log.exception(event, key=key, **kw)

    def _forget(self, origin: str, why: str) -> None:
        for key, plugin in self._plugins.items():
            try:
                plugin.forget(origin)
            except Exception:
                self._fail_once("sync_forget_failed", key, peer=origin)
        self.stats.forgotten += 1
        log.info("sync_peer_forgotten", peer=origin, reason=why)

    def _goodbye(self, origin: str) -> None:
        """``origin`` stopped cleanly: forget its contributions now, not after ``timeout`` of
        silence, and forget the peer itself (it is not silent, it is gone; a restart under the
        same id is a new peer)."""
        self._forget(origin, "said goodbye")
        self._last_seen.pop(origin, None)
        self._last_seq.pop(origin, None)
        self._silent.discard(origin)
        self.stats.goodbyes += 1

    # --- peers' liveness ------------------------------------------------------------------
    def check_peers(self) -> None:
        """Forget peers silent for ``timeout``; keep the peer gauges and the partition state."""
        now = asyncio.get_running_loop().time()
        for origin, seen in tuple(self._last_seen.items()):
            quiet = now - seen
            if origin not in self._silent and quiet > self.timeout:
                self._silent.add(origin)
                self._forget(origin, f"silent for {quiet:.3f}s")
            elif quiet > FORGET_AFTER:
                del self._last_seen[origin]
                self._last_seq.pop(origin, None)
                self._silent.discard(origin)
        configured = len(self.transport.peers) - self._self_listed
        connected = len(self._last_seen) - len(self._silent)
        gauges = (connected, max(0, configured - connected))
        if gauges != self._gauges:
            self._gauges = gauges
            metrics.PEERS.labels("connected").set(gauges[0])
            metrics.PEERS.labels("silent").set(gauges[1])
        partitioned = configured > 0 and connected == 0 and now - self._started_at > self.timeout
        if partitioned != self.partitioned:
            self.partitioned = partitioned
            metrics.PARTITIONED.set(1 if partitioned else 0)
            if partitioned:
                log.warning("sync_partitioned", peers=configured, routing="on this replica's own view")
            else:
                log.info("sync_partition_healed", connected=connected)

    @property
    def connected(self) -> int:
        return len(self._last_seen) - len(self._silent)

    # --- /debug ------------------------------------------------------------------------
    def debug_state(self) -> dict[str, Any]:
        """The sync's live state for ``/debug/plugins/state`` (key ``sync``): each peer heard
        (last heard, silent, last sequence), the batch counts both ways, what sent the batches
        (``timerFlushes``: a wake of their own; ``holdsJoined``: a later change sent them) and
        what ran the reads (``woken``: the descriptor's wakes; ``timer``: the busy timer; wakes the
        loop had anyway: ``riding`` this hub's sends, ``routing`` requests' ext_proc reads)."""
        now = self._loop_or_running().time()
        t = self.transport
        peers = {
            origin: {
                "lastHeardSecondsAgo": round(now - seen, 3),
                "silent": origin in self._silent,
                "lastSeq": self._last_seq.get(origin),
            }
            for origin, seen in sorted(self._last_seen.items())
        }
        s = self.stats
        return {
            "replicaId": self.replica_id,
            "serving": self.serving,
            "partitioned": self.partitioned,
            "restoredFrom": self.restored_from or None,
            "configuredPeers": [p.id for p in t.peers],
            "peers": peers,
            "keys": sorted(self._plugins),
            "pending": self._scheduled is not None,
            "holding": self._holding,
            "holdCredit": self._hold_credit,
            "gapSeconds": self.gap,
            "seq": self._seq,
            "batches": {
                "sent": s.sent,
                "received": s.received,
                "bytesSent": s.bytes_sent,
                "bytesReceived": s.bytes_received,
                "dropped": s.dropped,
                "forgotten": s.forgotten,
                "rejected": dict(s.rejected),
                "timerFlushes": s.timer_flushes,
                "holdsJoined": s.holds_joined,
                "gapsJoined": s.gaps_joined,
                "goodbyes": s.goodbyes,
                "resyncsAsked": s.resyncs_asked,
                "resends": s.resends,
            },
            "reads": {
                "woken": t.reads_woken,
                "timer": t.reads_timer,
                "riding": t.reads_riding,
                "routing": t.reads_routing,
                "timerWakes": t.timer_wakes,
                "messages": t.messages_read,
            },
        }

    # --- warm start --------------------------------------------------------------------
    def _answer(self, frames: Frames) -> bytes | None:
        try:
            requester, presented = decode_request(frames, REQUEST_MAX_BYTES)
        except WireError as e:
            self._reject(e.reason)
            return None
        if self.secret is not None and not self.secret.accepts(presented.encode("ascii", "replace")):
            self._reject("unauthenticated")
            if not self._warned_unauthenticated:  # once: the requester's id is its own claim
                self._warned_unauthenticated = True
                log.warning(
                    "sync_snapshot_unauthenticated",
                    requester=requester[:64],
                    counted="epp_sync_rejected_total",
                )
            return None
        snapshot: dict[str, Any] = {}
        if self.serving:
            for key, plugin in self._plugins.items():
                try:
                    snapshot[key] = plugin.snapshot()
                except Exception:
                    self._fail_once("sync_snapshot_failed", key)
        return encode((self.replica_id, self.serving, snapshot))

    def _accept(self, frames: Frames) -> bool:
        try:
            responder, serving, snapshot = decode_reply(frames, SNAPSHOT_MAX_BYTES)
        except WireError as e:
            self._reject(e.reason)
            return False
        if responder == self.replica_id:
            return False
        now = asyncio.get_running_loop().time()
        if not serving:  # warming up too: look a little longer for a warm peer, then start cold
            if self._cold_until is None:
                self._cold_until = now + COLD_PEER_GRACE
            return now >= self._cold_until
        for key, state in snapshot.items():
            plugin = self._plugins.get(key)
            if plugin is None:
                self._reject("unknown_key")
                continue
            try:
                plugin.restore(state)
                plugin.drain()  # restored state is not a local change
            except Exception:
                self._reject("apply")
                self._fail_once("sync_restore_failed", key, peer=responder)
        self.restored_from = responder
        return True

    async def _warm_start(self, peers: tuple[Peer, ...]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        if peers:
            request = encode(
                (self.replica_id,)
                if self.secret is None
                else (self.replica_id, self.secret.presented.decode())
            )
            await self.transport.request_snapshot(
                peers, request, self._accept, deadline=started + self.warm_start_timeout
            )
        seconds = round(loop.time() - started, 3)
        if self.restored_from:
            log.info("sync_warm_start", peer=self.restored_from, keys=sorted(self._plugins), seconds=seconds)
        else:
            log.info(
                "sync_cold_start",
                reason="no peers configured"
                if not peers
                else "every peer reached is starting too"
                if self._cold_until is not None
                else f"no peer answered within {self.warm_start_timeout:g}s",
                peers=[p.id for p in peers],
                seconds=seconds,
            )

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self, source: PeerSource) -> None:
        """Bind, connect to the first peer set, warm-start, then run; returns once serving."""
        loop = asyncio.get_running_loop()
        updates = source.updates()
        first = await anext(updates)
        self._set_peers(first)
        self._started_at = loop.time()
        self._loop = loop
        self._tasks.append(
            loop.create_task(self.transport.serve_snapshots(self._answer), name="sync-snapshots")
        )
        await self._warm_start(first)
        self.serving = True
        self.transport.listen(self.on_messages, self.read_gap)
        self._tasks += [
            loop.create_task(self._watch_peers(updates), name="sync-peers"),
            loop.create_task(self._tick(), name="sync-tick"),
            loop.create_task(self.transport.redial(), name="sync-redial"),
        ]

    async def _watch_peers(self, updates: Any) -> None:
        async for peers in updates:
            self._set_peers(peers)
            log.info("sync_peers_changed", peers=[p.id for p in peers], gap=self.gap)

    def _set_peers(self, peers: tuple[Peer, ...]) -> None:
        """Connect to ``peers``; the gap is the siblings' while every peer is a worker of this pod."""
        self.transport.set_peers(peers)
        only_siblings = self._sibling is not None and bool(peers) and all(map(self._sibling, peers))
        self.gap = self._sibling_coalesce if only_siblings else self._coalesce

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        slow = min(self.heartbeat, self.timeout / 4)
        while True:
            await asyncio.sleep(self.poll if self._polled else slow)
            if (self._polled or not self.transport.has_peers) and (
                self.interval <= 0 or loop.time() - self._last_flush >= self.interval
            ):
                self.flush()  # what dirty() did not schedule: plugins that do not say, or no peers
            if loop.time() - self._last_sent >= self.heartbeat:
                self._publish({})
            self.check_peers()
            self.ticks += 1

    async def stop(self, *, goodbye: bool = True) -> None:
        """Send what is pending and (``goodbye``) tell peers this replica is gone, stop the tasks
        and close the sockets.  ``goodbye=False`` leaves as a crash does (tests of silence)."""
        said = False
        if self._tasks:
            with contextlib.suppress(Exception):
                self.flush()
            if goodbye and self.transport.has_peers:
                with contextlib.suppress(Exception):
                    self._publish({GOODBYE: []})  # peers forget us now, not after their timeout
                    said = True
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._resend_timer is not None:
            self._resend_timer.cancel()
            self._resend_timer = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.transport.close(linger=GOODBYE_LINGER if said else 0.0)
        self.serving = False
