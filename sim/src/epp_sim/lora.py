"""LoRA adapters: those a replica serves (registry) and those resident in an engine's GPU slots."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    path: str
    id: int  # vLLM's lora_int_id: 1, 2, ... in load order


class LoraRegistry:
    """Adapters a replica serves: `--lora-modules name[=path]` plus /v1/load_lora_adapter; shared by ranks."""

    def __init__(self, modules: Iterable[str] = ()) -> None:
        self._adapters: dict[str, Adapter] = {}
        self._next_id = 1
        for module in modules:
            name, _, path = module.partition("=")
            self.load(name, path or f"/adapters/{name}")

    def get(self, name: str) -> Adapter | None:
        return self._adapters.get(name)

    def load(self, name: str, path: str) -> Adapter:
        adapter = Adapter(name=name, path=path, id=self._next_id)
        self._next_id += 1
        self._adapters[name] = adapter
        return adapter

    def unload(self, name: str) -> bool:
        return self._adapters.pop(name, None) is not None

    def adapters(self) -> tuple[Adapter, ...]:
        return tuple(self._adapters.values())


class LoraSlots:
    """`max_loras` GPU slots of one engine, LRU: an adapter not resident costs one load when scheduled."""

    __slots__ = ("_max", "_resident")

    def __init__(self, max_loras: int) -> None:
        self._max = max_loras
        self._resident: OrderedDict[str, None] = OrderedDict()

    @property
    def resident(self) -> tuple[str, ...]:
        return tuple(self._resident)

    def ensure(self, needed: Iterable[str]) -> int:
        """Make every adapter in `needed` (at most max_loras) resident; returns how many were loaded."""
        needed = tuple(needed)
        loads = 0
        for name in needed:
            if name in self._resident:
                self._resident.move_to_end(name)
                continue
            while len(self._resident) >= self._max:
                victim = next((n for n in self._resident if n not in needed), None)
                if victim is None:
                    raise RuntimeError(f"more than max_loras={self._max} adapters needed at once: {needed}")
                del self._resident[victim]
            self._resident[name] = None
            loads += 1
        return loads

    def clear(self) -> None:
        self._resident.clear()
