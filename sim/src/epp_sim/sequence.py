"""A request inside the engine (`Seq`) and the error for requests the engine refuses."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from typing import Final

from epp_sim.lora import Adapter
from epp_sim.tokens import OutputStream

WAITING: Final = 0
RUNNING: Final = 1
FINISHED: Final = 2


class RequestRejected(Exception):
    """The engine refuses a request before queueing it; the HTTP and gRPC layers shape the error."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type


class Seq:
    """One request inside the engine. The serving layer reads `output`, `finish_reason` and waits."""

    __slots__ = (
        "_loop",
        "adapter",
        "arrival",
        "cached_tokens",
        "delivered",
        "embedding",
        "error",
        "extra",
        "finish_reason",
        "first_extra",
        "first_token_at",
        "hashes",
        "held",
        "ignore_eos",
        "last_digest",
        "last_token_at",
        "max_tokens",
        "num_computed",
        "num_stored",
        "output",
        "prompt_len",
        "request_id",
        "sampler",
        "scheduled_at",
        "sink",
        "state",
        "stream",
        "tokens",
        "waiter",
    )

    def __init__(
        self,
        request_id: str,
        tokens: array[int],
        *,
        max_tokens: int,
        ignore_eos: bool = False,
        adapter: Adapter | None = None,
        embedding: bool = False,
        stream: bool = False,
        sampler: OutputStream,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.tokens = tokens
        self.prompt_len = len(tokens)
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.adapter = adapter
        # vLLM's extra hash keys: the LoRA name for adapter requests, else None
        self.extra: tuple[str, ...] | None = (adapter.name,) if adapter is not None else None
        # the first block's extra keys: vLLM adds cache_salt there only, after the LoRA name
        self.first_extra = (*(self.extra or ()), cache_salt) if cache_salt else self.extra
        self.last_digest: bytes | None = None  # the full digest of the last hashed block (the chain)
        self.embedding = embedding
        self.stream = stream
        self.sampler = sampler
        self.output: list[int] = []  # vocabulary indices of generated words
        self.hashes: list[int] = []  # chained hashes of every full block of `tokens`
        self.held: list[int | None] = []  # per allocated block: its hash if cached, else None
        self.num_computed = 0
        self.num_stored = 0
        self.state = WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.arrival = 0.0
        self.scheduled_at = 0.0
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.cached_tokens = -1  # prefix-cache hit at first scheduling; -1 until then
        self.delivered = 0  # outputs the serving layer already sent
        self.waiter: asyncio.Future[None] | None = None
        # streaming fast path: called with each new token in the engine's step; True = delivered
        self.sink: Callable[[Seq], bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # cached: get_running_loop() costs a getpid()

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    async def wait(self) -> None:
        """Return when the sequence finished or, if streaming, has output not yet delivered."""
        if self.state == FINISHED or (self.stream and self.delivered < len(self.output)):
            return
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        await self.waiter

    def _notify(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
