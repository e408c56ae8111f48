"""py-spy's raw stacks reduced to self and inclusive costs."""

from __future__ import annotations

from bench.profiling import summarize_stacks

RAW = (
    "process 1:main (python);run (runpy.py:1);serve (/work/src/epp/server/extproc.py:10);"
    "route (/work/src/epp/director/director.py:5);hash (/work/src/epp/director/producers/prefix_hash.py:7) 6\n"
    "process 1:main (python);run (runpy.py:1);serve (/work/src/epp/server/extproc.py:10) 3\n"
    "process 1:main (python);run (runpy.py:1);_write (/x/site-packages/grpc/aio/_call.py:9) 1\n"
    "process 1:main (python);run (runpy.py:1);epoll_wait (libc.so.6) 5\n"
    "garbage line\n"
)


def test_summarize_stacks() -> None:
    """Leaf frames get self time, every frame gets inclusive time; native waits are idle, not cost."""
    s = summarize_stacks(RAW)
    assert s["samples"] == 10
    assert s["idle_samples"] == 5
    self_ = {e["function"]: e["share"] for e in s["self"]}
    incl = {e["function"]: e["share"] for e in s["inclusive"]}
    assert self_["hash (epp/director/producers/prefix_hash.py)"] == 0.6
    assert self_["serve (epp/server/extproc.py)"] == 0.3
    assert self_["_write (grpc/aio/_call.py)"] == 0.1
    assert incl["serve (epp/server/extproc.py)"] == 0.9
    assert incl["run (runpy.py)"] == 1.0
