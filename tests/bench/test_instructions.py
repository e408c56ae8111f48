"""bench/instructions: every stage it counts is on a request's path, and its windows route requests.

Valgrind is not run here (it takes minutes); the markers are plain system calls without it.
"""

from __future__ import annotations

import gc
import operator
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import instructions


@pytest.fixture
def no_gc_tuning(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The bench tunes and freezes the collector for its process; a test must not keep that."""
    monkeypatch.setattr(instructions, "tune_gc", lambda: None)
    monkeypatch.setattr(instructions, "WARMUP", 20)
    monkeypatch.setattr(instructions, "STAGE_WARMUP", 5)
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("no_gc_tuning")
@pytest.mark.parametrize("config", ["default", "prefix-heavy"])
async def test_every_stage_runs_inside_its_window(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stage's callable is reached by the requests of its window (a renamed or bypassed one
    would count nothing and the table would say 0), and the originals are put back.  The load
    plugins' stages (``PLUGIN_STAGES``) are on prefix-heavy's path, not on the default config's."""
    calls: Counter[str] = Counter()
    real_call = operator.call

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls[fn.__qualname__] += 1
        return real_call(fn, *args, **kwargs)

    monkeypatch.setattr(operator, "call", counting)
    before = [_resolve(module, owner, attr) for module, owner, attr in instructions.STAGES.values()]
    await instructions.run_stages(config, 3)
    for (name, (module, owner, attr)), original in zip(instructions.STAGES.items(), before, strict=True):
        assert _resolve(module, owner, attr) is original
        if (config == "default" and name in instructions.PLUGIN_STAGES) or instructions.compiled(module):
            assert calls[original.__qualname__] == 0, name  # not on the path, or not wrappable
            continue
        assert calls[original.__qualname__] >= 3, (module, owner, attr)
    assert instructions.STAGES.keys() >= instructions.PLUGIN_STAGES
    split = [m for m, _, _ in instructions.STAGES.values() if not instructions.compiled(m)]
    assert len(split) >= 10  # most stages are still split out


@pytest.mark.usefixtures("no_gc_tuning")
async def test_the_measured_windows_route_every_config_and_the_floor() -> None:
    await instructions.run_inner([instructions.FLOOR, "default", "prefix-heavy"], 3)


def test_totals_are_read_from_a_dump(tmp_path: Path) -> None:
    dump = tmp_path / "callgrind.out.2-01"
    dump.write_text("# callgrind format\nevents: Ir\nsummary: 123456\nfn=(1) x\n1 2\n")
    assert instructions.total_ir(dump) == 123456
    (tmp_path / "empty").write_text("events: Ir\n")
    with pytest.raises(RuntimeError, match="no totals line"):
        instructions.total_ir(tmp_path / "empty")


def _resolve(module: str, owner: str, attr: str) -> Any:
    import importlib

    mod = importlib.import_module(module)
    return getattr(getattr(mod, owner) if owner else mod, attr)
