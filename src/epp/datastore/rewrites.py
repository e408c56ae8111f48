"""InferenceModelRewrite rules: which target model a client-facing model name becomes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class RewriteTarget:
    model: str
    weight: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RewriteRule:
    """One rule: exact model matches (empty = matches any model) and weighted targets."""

    matches: tuple[str, ...] = ()
    targets: tuple[RewriteTarget, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRewrite:
    """An InferenceModelRewrite object; ``created`` orders precedence (oldest wins)."""

    name: str
    rules: tuple[RewriteRule, ...] = ()
    created: float = 0.0  # seconds since epoch (creationTimestamp); ties broken by name


@dataclass(frozen=True, slots=True)
class RewriteDecision:
    rewrite_name: str
    target_model: str


@dataclass(slots=True)
class _Indexed:
    exact: dict[str, tuple[ModelRewrite, RewriteRule]] = field(default_factory=dict)
    generic: tuple[ModelRewrite, RewriteRule] | None = None


class RewriteTable:
    """Rules indexed by model; an exact match beats a generic rule, then the oldest object wins."""

    __slots__ = ("_index", "_rewrites", "applies")

    def __init__(self) -> None:
        self._rewrites: dict[str, ModelRewrite] = {}
        self._index = _Indexed()
        # Whether some rule has targets, so ``decide`` may rewrite: a slot the director reads
        # every request (``len()`` of the table was a Python ``__len__`` call).
        self.applies = False

    def set_all(self, rewrites: Sequence[ModelRewrite]) -> None:
        self._rewrites = {r.name: r for r in rewrites}
        self._reindex()

    def upsert(self, rewrite: ModelRewrite) -> None:
        self._rewrites[rewrite.name] = rewrite
        self._reindex()

    def remove(self, name: str) -> None:
        if self._rewrites.pop(name, None) is not None:
            self._reindex()

    def clear(self) -> None:
        self.set_all(())

    def __len__(self) -> int:
        return len(self._rewrites)

    def _reindex(self) -> None:
        index = _Indexed()
        for rw in sorted(self._rewrites.values(), key=lambda r: (r.created, r.name)):
            for rule in rw.rules:
                if not rule.targets:
                    continue
                if not rule.matches:
                    if index.generic is None:
                        index.generic = (rw, rule)
                    continue
                for model in rule.matches:
                    index.exact.setdefault(model, (rw, rule))
        self._index = index
        self.applies = index.generic is not None or bool(index.exact)

    def decide(self, model: str, rng: random.Random) -> RewriteDecision | None:
        """Pick a target for ``model`` by weight (all-zero weights → uniform); None if no rule applies."""
        hit = self._index.exact.get(model) or self._index.generic
        if hit is None:
            return None
        rw, rule = hit
        targets = rule.targets
        total = sum(t.weight for t in targets)
        if total <= 0:
            chosen = targets[rng.randrange(len(targets))]
        else:
            x = rng.randrange(total)
            for chosen in targets:
                x -= chosen.weight
                if x < 0:
                    break
        return RewriteDecision(rewrite_name=rw.name, target_model=chosen.model)
