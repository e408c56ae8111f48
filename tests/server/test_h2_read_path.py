"""The read path of the h2 transport: a request routed and answered within the read that completed it.

Routing runs eagerly in the read callback (``eager.start``) and a read's replies are flushed
as the read returns, so the routing reply needs no loop iteration and leaves in one write; a
request whose routing waits still gets its reply, from the task that took over.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import pytest

from epp._pb.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as mode_pb
from epp._pb.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.datalayer.api import Endpoint
from epp.director.director import Director
from epp.plugin.base import TypedName
from epp.plugin.state import CycleState
from epp.request import InferenceRequest
from epp.scheduling.api import SchedulingResult
from epp.server.extproc import ExtProcServicer
from epp.server.h2 import H2GrpcServer
from epp.server.h2 import connection as h2connection
from epp.server.h2 import frames as f
from tests.server.h2peer import PROCESS, frame, grpc_message
from tests.server.harness import Harness, header_map, pods
from tests.server.test_h2_fuzz import MemoryTransport, block, parse

FULL_DUPLEX = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
T = TypeVar("T")
BODY = b'{"model":"my-model","prompt":"hi there, route me","max_tokens":3}'


def _request(sid: int) -> bytes:
    headers = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map({":path": "/v1/completions", ":method": "POST"})),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX
        ),
    )
    body = pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))
    messages = grpc_message(headers.SerializeToString()) + grpc_message(body.SerializeToString())
    return frame(f.HEADERS, f.END_HEADERS, sid, block(PROCESS)) + frame(f.DATA, 0, sid, messages)


class _Writes(MemoryTransport):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


def _routing_replies(out: bytes, sid: int) -> list[pb.ProcessingResponse]:
    replies = []
    for kind, _, stream, payload in parse(out):
        if kind == f.DATA and stream == sid:
            replies.append(pb.ProcessingResponse.FromString(payload[5:]))
    return replies


async def _read_as_the_loop_does(conn: h2connection.Connection, data: bytes, seen: Callable[[], T]) -> T:
    """``conn.data_received(data)`` from a loop callback (no task current), as the loop calls it;
    what ``seen()`` returns right after the read returned, before anything else runs."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def read() -> None:
        try:
            conn.data_received(data)
        except Exception as e:
            done.set_exception(e)
        else:
            done.set_result(seen())

    loop.call_soon(read)
    return await asyncio.wait_for(done, 5.0)


def _connect(h: Harness) -> tuple[h2connection.Connection, _Writes]:
    conn = h2connection.Connection(H2GrpcServer(ExtProcServicer(h.director)))
    t = _Writes()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(f.PREFACE + frame(f.SETTINGS, 0, 0))
    return conn, t


async def test_a_request_is_routed_and_answered_in_one_write_within_its_read() -> None:
    h = Harness()
    h.set_pods(pods((0, 0, 0.1), (1, 3, 0.2)))
    conn, t = _connect(h)
    await asyncio.sleep(0)  # the SETTINGS and their ACK leave
    t.out.clear()
    t.writes = 0
    writes, out = await _read_as_the_loop_does(conn, _request(1), lambda: (t.writes, bytes(t.out)))
    assert writes == 1  # HEADERS, the routing reply and the body, together, before the read returned
    replies = _routing_replies(out, 1)
    assert replies[0].WhichOneof("response") == "request_headers"
    destination = {
        o.header.key: o.header.raw_value
        for o in replies[0].request_headers.response.header_mutation.set_headers
    }["x-gateway-destination-endpoint"]
    assert destination in (b"192.168.1.1:8000", b"192.168.1.2:8000")
    assert replies[-1].request_body.response.body_mutation.streamed_response.end_of_stream
    conn.connection_lost(None)


class _GatedAdmission:
    """Admission that waits for ``gate``: routing suspends, as under flow control."""

    def __init__(self) -> None:
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        await self.gate

    def notify(self) -> None:
        pass

    def placed(self, request: InferenceRequest, *, scheduled: bool) -> None:
        pass


async def test_a_request_whose_routing_waits_is_answered_by_the_task_that_took_over() -> None:
    h = Harness()
    h.set_pods(pods((0, 0, 0.1)))
    admission = _GatedAdmission()
    h.director = Director(h.datastore, dataclasses.replace(h.director.pipeline, admission=admission))
    conn, t = _connect(h)
    await asyncio.sleep(0)
    t.out.clear()
    conn.data_received(_request(1))
    await asyncio.sleep(0)
    assert not _routing_replies(bytes(t.out), 1)  # routing waits at admission
    admission.gate.set_result(None)
    for _ in range(100):
        if _routing_replies(bytes(t.out), 1):
            break
        await asyncio.sleep(0)
    replies = _routing_replies(bytes(t.out), 1)
    assert replies and replies[0].WhichOneof("response") == "request_headers"
    conn.connection_lost(None)


class _WritesSeen:
    """A pre-request hook noting how many writes the transport had made when it ran."""

    typed_name = TypedName("writes-seen", "writes-seen")
    AFTER_REPLY: ClassVar[bool] = False

    def __init__(self) -> None:
        self.transport: _Writes | None = None
        self.seen: list[int] = []

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        assert self.transport is not None
        self.seen.append(self.transport.writes)


class _WritesSeenAfterReply(_WritesSeen):
    AFTER_REPLY: ClassVar[bool] = True  # it only records: it may run once the reply is written


@pytest.mark.parametrize(("hook_kind", "writes_when_run"), [(_WritesSeenAfterReply, 1), (_WritesSeen, 0)])
async def test_a_recording_hook_runs_after_the_routing_reply_is_written(
    hook_kind: type[_WritesSeen], writes_when_run: int
) -> None:
    """Within the read that routed the request: after its one write for ``AFTER_REPLY`` hooks,
    before it for the others (they may change the reply)."""
    h = Harness()
    h.set_pods(pods((0, 0, 0.1), (1, 3, 0.2)))
    hook = hook_kind()
    h.director = Director(h.datastore, dataclasses.replace(h.director.pipeline, pre_request=(hook,)))  # type: ignore[arg-type]
    conn, t = _connect(h)
    hook.transport = t
    await asyncio.sleep(0)  # the SETTINGS and their ACK leave
    t.writes = 0
    assert await _read_as_the_loop_does(conn, _request(1), lambda: t.writes) == 1
    assert hook.seen == [writes_when_run]  # it ran within the read either way, once
    conn.connection_lost(None)


class _Finished:
    """Stands in for the after-reply queue: notes whether each read came after an idle connection."""

    def __init__(self) -> None:
        self.reading = False
        self.idle: list[bool] = []

    def finished_reading(self, idle: bool) -> None:
        self.reading = False
        self.idle.append(idle)


async def test_a_read_after_a_quiet_connection_tells_the_queue_it_found_the_epp_idle() -> None:
    """One request at a time (the previous read longer ago than IDLE_BEFORE_READ): the queue may
    let the process its replies woke go first; a read right after another (a busy loop) may not."""
    h = Harness()
    conn, _ = _connect(h)
    queue = _Finished()
    conn._after_reply = queue
    ping = frame(f.PING, 0, 0, b"12345678")
    conn._last_read = conn.loop.time() - 10 * h2connection.IDLE_BEFORE_READ
    conn.data_received(ping)
    conn.data_received(ping)  # the loop's clock has not moved: right after the first
    assert queue.idle == [True, False]
    conn.connection_lost(None)
