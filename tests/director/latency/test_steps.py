"""StepClock: the EPP's view of which engine step its pending prefill is in."""

from __future__ import annotations

import pytest

from epp.director.latency.steps import StepClock


def test_idle_endpoint_starts_a_step_and_later_requests_queue_behind_it() -> None:
    c = StepClock()
    assert (c.current, c.queued, c.elapsed(5.0)) == (0.0, 0.0, 0.0)
    a = c.dispatch(1000.0, now=10.0)
    assert (c.current, c.queued) == (1000.0, 0.0)
    assert c.elapsed(10.25) == pytest.approx(0.25)
    b = c.dispatch(300.0, now=10.1)
    d = c.dispatch(200.0, now=10.2)
    assert (c.current, c.queued) == (1000.0, 500.0)
    c.first_token(a, 1000.0, now=10.3)  # the running step ended: the queued prefill runs now
    assert (c.current, c.queued) == (500.0, 0.0)
    assert c.elapsed(10.4) == pytest.approx(0.1)
    e = c.dispatch(400.0, now=10.35)
    assert (c.current, c.queued) == (500.0, 400.0)
    c.first_token(b, 300.0, now=10.5)  # b's step ended: e (queued behind it) runs now
    assert (c.current, c.queued, c.started) == (400.0, 0.0, 10.5)
    c.first_token(d, 200.0, now=10.51)  # the same step's other request: a straggler, no new step
    assert (c.current, c.started) == (400.0, 10.5)
    c.first_token(e, 400.0, now=10.7)
    assert (c.pending, c.current, c.queued, c.elapsed(11.0)) == (0, 0.0, 0.0, 0.0)


def test_straggler_of_an_ended_step_does_not_restart_the_clock() -> None:
    c = StepClock()
    a = c.dispatch(100.0, now=0.0)
    b = c.dispatch(100.0, now=0.01)  # queued
    a2 = c.dispatch(50.0, now=0.02)  # queued too
    c.first_token(a, 100.0, now=0.1)  # b and a2 now run, started at 0.1
    assert (c.current, c.started) == (150.0, 0.1)
    q = c.dispatch(70.0, now=0.15)
    assert c.queued == 70.0
    c.first_token(b, 100.0, now=0.2)  # b's step ended: q runs from 0.2
    assert (c.current, c.queued, c.started) == (70.0, 0.0, 0.2)
    c.first_token(a2, 50.0, now=0.21)  # same step as b: it ends nothing new
    assert (c.current, c.started) == (70.0, 0.2)
    c.first_token(q, 70.0, now=0.3)
    assert c.pending == 0 and c.current == 0.0


def test_cancel_releases_tokens_without_ending_the_step() -> None:
    c = StepClock()
    a = c.dispatch(100.0, now=1.0)
    b = c.dispatch(40.0, now=1.1)
    c.cancel(b, 40.0)  # failed before any token: the running step goes on
    assert (c.current, c.queued, c.started) == (100.0, 0.0, 1.0)
    c.cancel(a, 100.0)
    assert (c.pending, c.current) == (0, 0.0)
    c.dispatch(10.0, now=2.0)  # a fresh step after everything cleared
    assert (c.current, c.started) == (10.0, 2.0)


def test_rate_is_prefill_tokens_per_busy_second() -> None:
    c = StepClock()
    assert c.rate == 0.0  # no history
    a = c.dispatch(1000.0, now=100.0)
    c.first_token(a, 1000.0, now=100.1)  # 1000 tokens in 0.1 busy s
    assert c.rate == 0.0  # too little busy time to tell
    t = 100.1
    for _ in range(5):
        s = c.dispatch(2000.0, now=t + 1.0)  # idle in between: idle time does not count
        c.first_token(s, 2000.0, now=t + 1.2)
        t += 1.2
    assert c.rate == pytest.approx(10_000.0, rel=0.05)  # 2000 tokens per 0.2 busy s (and 1000 per 0.1 s)
