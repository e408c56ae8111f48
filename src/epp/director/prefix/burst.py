"""The joint placement of one burst window (llm-d-router v0.10 ``burstprefix/assign.go``).

Kept apart from the plugin so the placement is a pure function of the window's entries: the
upstream unit-test vectors run against it directly.  A request's prefix is its chained block
hashes (flattened over prompts, as upstream's walks are), so an equal leading run of hashes
means an equal leading prompt prefix.

Placement, as upstream:

* identical prompts (the same full hash sequence) form a group; a group of two or more is a
  unit; a lone request is a unit only when ``minColocateBlocks > 0`` and its first
  ``minColocateBlocks`` blocks equal those of another request in the window;
* groups are placed before lone units, each tier longest prefix first (stable);
* a unit's first replica is, with ``minColocateBlocks > 0``, the one already holding the
  longest shared prefix (at least ``minColocateBlocks`` blocks) that is under its fair share
  ``ceil(total / replicas)`` of the window and under ``k`` for this unit; else the least
  loaded; further members (when ``k`` caps a replica) spill to the least loaded;
* "least loaded": the window's load (requests, or prefix blocks with ``balanceBy: tokens``,
  charged once per replica minus the blocks it already holds), then running requests, then
  name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from epp.datalayer.api import Endpoint

UNLIMITED: Final = -1  # maxPerReplica / maxBatchSize sentinel


@dataclass(slots=True, eq=False)
class Entry:
    """One request of a window: its prefix, its candidates, and (once sealed) its replica's name."""

    hashes: tuple[int, ...]
    endpoints: Sequence[Endpoint]
    assigned: str | None = None  # None: no affinity (a lone or prefix-less request)


@dataclass(slots=True)
class _Window:
    """Per-seal scratch: load per replica name and which replicas hold each block."""

    by_tokens: bool
    load: dict[str, int] = field(default_factory=dict)
    holders: dict[int, set[str]] = field(default_factory=dict)

    def held_prefix(self, hashes: tuple[int, ...]) -> dict[str, int]:
        """Per replica, how many leading blocks of ``hashes`` it already holds in this window.

        Holding block i implies holding 0..i (a whole prefix is added at once), so the walk
        stops at the first block nobody holds."""
        res: dict[str, int] = {}
        holders = self.holders
        for h in hashes:
            names = holders.get(h)
            if not names:
                break
            for name in names:
                res[name] = res.get(name, 0) + 1
        return res

    def add(self, hashes: tuple[int, ...], name: str) -> None:
        for h in hashes:
            names = self.holders.get(h)
            if names is None:
                self.holders[h] = {name}
            else:
                names.add(name)


def _running(ep: Endpoint) -> int:
    return ep.metrics.running_requests_size


def _better(a: Endpoint, b: Endpoint | None, load: dict[str, int]) -> bool:
    """Whether ``a`` is preferred over ``b``: lower window load, fewer running requests, lower name."""
    if b is None:
        return True
    an, bn = a.metadata.name, b.metadata.name
    la, lb = load.get(an, 0), load.get(bn, 0)
    if la != lb:
        return la < lb
    ra, rb = _running(a), _running(b)
    if ra != rb:
        return ra < rb
    return an < bn


def _least_loaded(
    replicas: Sequence[Endpoint], per_replica: dict[str, int], k: int, load: dict[str, int]
) -> Endpoint:
    best: Endpoint | None = None
    for r in replicas:
        if k != UNLIMITED and per_replica.get(r.metadata.name, 0) >= k:
            continue
        if _better(r, best, load):
            best = r
    if best is not None:
        return best
    for r in replicas:  # every replica at k: the overall least loaded
        if _better(r, best, load):
            best = r
    assert best is not None  # replicas is never empty here
    return best


def _pick(
    replicas: Sequence[Endpoint],
    per_replica: dict[str, int],
    k: int,
    window: _Window,
    matches: dict[str, int],
    min_colocate: int,
    max_share: int,
    prefer_match: bool,
) -> Endpoint:
    load = window.load
    if prefer_match:
        best: Endpoint | None = None
        best_match = 0
        for r in replicas:
            name = r.metadata.name
            if k != UNLIMITED and per_replica.get(name, 0) >= k:
                continue
            if load.get(name, 0) >= max_share:
                continue  # at its fair share: co-locating here would unbalance the window
            m = matches.get(name, 0)
            if m < min_colocate:
                continue
            if best is None or m > best_match or (m == best_match and _better(r, best, load)):
                best, best_match = r, m
        if best is not None:
            return best
    return _least_loaded(replicas, per_replica, k, load)


def _place(
    members: list[Entry],
    replicas: Sequence[Endpoint],
    k: int,
    min_colocate: int,
    max_share: int,
    cost: int,
    window: _Window,
) -> None:
    hashes = members[0].hashes  # an identical group: any member stands for it
    prefer_match = min_colocate > 0
    matches = window.held_prefix(hashes) if prefer_match or window.by_tokens else {}
    per_replica: dict[str, int] = {}
    load = window.load
    i = 0
    while i < len(members):
        target = _pick(replicas, per_replica, k, window, matches, min_colocate, max_share, prefer_match)
        name = target.metadata.name
        run = len(members) - i
        if k != UNLIMITED:
            # more members than k * replicas: place one and rebalance
            run = min(run, max(k - per_replica.get(name, 0), 1))
        for m in members[i : i + run]:
            m.assigned = name
        first_touch = name not in per_replica
        per_replica[name] = per_replica.get(name, 0) + run
        if not window.by_tokens:
            load[name] = load.get(name, 0) + run
        elif first_touch:
            # the prefix is prefilled once per replica, minus what that replica already holds
            load[name] = load.get(name, 0) + max(cost - matches.get(name, 0), 0)
        i += run
        prefer_match = False  # only the first replica gets the prefix preference
    for name in per_replica:
        window.add(hashes, name)


def _shared_keys(groups: dict[tuple[int, ...], list[Entry]], min_colocate: int) -> set[tuple[int, ...]]:
    """Keys whose first ``min_colocate`` blocks are shared by at least two requests of the window."""
    if min_colocate <= 0:
        return set()
    count: dict[tuple[int, ...], int] = {}
    sig: dict[tuple[int, ...], tuple[int, ...]] = {}
    for key, members in groups.items():
        if len(key) < min_colocate:
            continue
        s = sig[key] = key[:min_colocate]
        count[s] = count.get(s, 0) + len(members)
    return {key for key, s in sig.items() if count[s] >= 2}


def assign(entries: Sequence[Entry], k: int, min_colocate: int, by_tokens: bool) -> None:
    """Set ``assigned`` on the entries of one sealed window (module docstring)."""
    groups: dict[tuple[int, ...], list[Entry]] = {}  # insertion order = arrival order
    replicas: Sequence[Endpoint] = ()
    for e in entries:
        if not e.hashes:
            continue
        members = groups.get(e.hashes)
        if members is None:
            groups[e.hashes] = [e]
        else:
            members.append(e)
        if not replicas:
            replicas = e.endpoints
    if not replicas:
        return
    shared = _shared_keys(groups, min_colocate)
    group_units = [key for key, members in groups.items() if len(members) >= 2]
    single_units = [key for key, members in groups.items() if len(members) == 1 and key in shared]
    if not group_units and not single_units:
        return
    # longest prefix first (stable): shorter units then match against the most placed blocks
    group_units.sort(key=len, reverse=True)
    single_units.sort(key=len, reverse=True)
    units = (*group_units, *single_units)
    total = sum(len(key) if by_tokens else len(groups[key]) for key in units)
    max_share = -(-total // len(replicas))  # ceil: each replica's fair share of the window
    window = _Window(by_tokens)
    for key in units:
        _place(groups[key], replicas, k, min_colocate, max_share, len(key), window)
