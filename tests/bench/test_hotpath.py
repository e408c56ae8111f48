"""bench/hotpath drives the real transport, session and director to the end of every request."""

from __future__ import annotations

from bench.hotpath import DEFAULT_CONFIG, Client, epp_server, measure, request_messages
from bench.noop_extproc import NoopProcessor
from epp.scheduling.scheduler import Scheduler
from epp.server.h2.server import H2GrpcServer


async def test_both_paths_answer_every_request_in_at_most_two_writes() -> None:
    msgs = [request_messages(i) for i in range(4)]
    epp = Client(epp_server(DEFAULT_CONFIG.read_text(), 4), msgs)
    floor = Client(H2GrpcServer(NoopProcessor(["10.0.0.1:8000"])), msgs)
    for client in (epp, floor):
        us = await measure(client, 20)  # raises if a request does not finish
        assert us > 0
        # Request side and response side each leave in one write (the first may join the handshake's).
        assert 2 * 20 - 2 <= client.transport.writes <= 2 * 20 + 1
        assert not client.conn._streams
    assert epp.transport.written > floor.transport.written // 2  # the EPP answered with bodies, too


async def test_the_general_path_server_routes_too_and_its_scheduler_is_not_fused() -> None:
    msgs = [request_messages(i) for i in range(4)]
    server = epp_server(DEFAULT_CONFIG.read_text(), 4, fused=False)
    for fused, srv in ((False, server), (True, epp_server(DEFAULT_CONFIG.read_text(), 4))):
        scheduler = srv._servicer._director.pipeline.scheduler
        assert isinstance(scheduler, Scheduler)
        assert (scheduler.fused is not None) is fused
    general = Client(server, msgs)
    assert await measure(general, 20) > 0  # raises if a request does not finish
    assert not general.conn._streams
    assert 2 * 20 - 2 <= general.transport.writes <= 2 * 20 + 1
