"""bench/critical_path: each read paired with the write that answered it, from ``perf script`` text."""

from __future__ import annotations

from bench.critical_path import medians, waits


def _line(tid: int, t: float, kind: str, nr: int, tail: str) -> str:
    """One ``perf script`` line of a raw_syscalls recording, as perf prints it."""
    event = "raw_syscalls:sys_exit: " if kind == "exit" else "raw_syscalls:sys_enter:"
    return f"          python {tid} [001] {t:.6f}: {event} NR {nr} {tail}"


def _read(tid: int, t: float, n: int) -> list[str]:
    return [
        _line(tid, t - 1e-6, "enter", 0, "(10, 5600ab371de0, 3e800, 0, 0, 0)"),
        _line(tid, t, "exit", 0, f"= {n}"),
    ]


def _write(tid: int, t: float) -> list[str]:
    return [
        _line(tid, t, "enter", 1, "(10, 5600abbeece0, 4ea, 0, 0, 0)"),
        _line(tid, t + 2e-6, "exit", 1, "= 1258"),
    ]


def _wait(tid: int, t: float) -> list[str]:
    return [_line(tid, t, "enter", 281, "(3, 7ffc5cb8e6d0, 400, 3e8, 0, 8)")]


def test_each_read_is_paired_with_the_write_that_answered_it_by_class() -> None:
    loop, other = 100, 101
    lines = [
        *_read(loop, 1.000000, 1449),  # a request: answered 150 µs later
        *_read(loop, 1.000050, 300),  # read again before answering: the first read's time counts
        *_write(loop, 1.000150),
        *_wait(loop, 1.000200),
        *_read(loop, 1.001000, 460),  # a response: answered 60 µs later
        *_write(loop, 1.001060),
        *_read(loop, 1.002000, 13),  # a control frame: answered 10 µs later
        *_write(loop, 1.002010),
        *_read(loop, 1.003000, 900),  # read, then back to sleep: answered by nothing
        *_wait(loop, 1.003020),
        *_write(loop, 1.003500),  # a write with no read before it (a timer's): not a wait
        *_read(other, 1.004000, 2000),  # another thread's calls do not count
        *_write(other, 1.004100),
        "some line perf prints that is not a system call",
    ]
    # the loop's thread is the busiest one
    w = waits(lines)
    assert [round(x) for x in w["request"]] == [150]
    assert [round(x) for x in w["response"]] == [60]
    assert [round(x) for x in w["control"]] == [10]


def test_medians_keep_classes_seen_often_enough() -> None:
    w = {"request": [float(x) for x in range(1, 100)], "response": [5.0, 7.0], "control": []}
    assert medians(w) == {"request": 50.0}
    assert medians(w, least=2) == {"request": 50.0, "response": 6.0}
    assert waits([]) == {}
