"""The engine's time model: how long one scheduler step takes, in modelled milliseconds."""

from __future__ import annotations

from dataclasses import dataclass

from epp_sim.config import EngineConfig


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computes: the inputs of the time model."""

    prefill_tokens: int  # uncached prompt tokens computed this step (chunked prefill)
    decode_seqs: int  # sequences decoding one token this step
    context_tokens: int  # tokens already in the KV cache of the decoding sequences
    lora_loads: int  # adapters brought into a GPU slot for this step


@dataclass(frozen=True, slots=True)
class TimeModel:
    """step_ms = base + prefill·prefill_tokens + per_seq·decode_seqs + per_1k·context/1000 + lora·loads.

    `base` is the weight read of one forward pass (memory bound), prefill is compute bound per token,
    decode adds a per-sequence cost and an attention cost per cached context token.
    """

    base_ms: float
    prefill_ms_per_token: float
    decode_ms_per_seq: float
    decode_ms_per_1k_context: float
    lora_load_ms: float

    @classmethod
    def from_config(cls, config: EngineConfig) -> TimeModel:
        return cls(
            base_ms=config.step_base_ms,
            prefill_ms_per_token=config.prefill_ms_per_token,
            decode_ms_per_seq=config.decode_ms_per_seq,
            decode_ms_per_1k_context=config.decode_ms_per_1k_context,
            lora_load_ms=config.lora_load_ms,
        )

    def step_ms(self, work: StepWork) -> float:
        return (
            self.base_ms
            + self.prefill_ms_per_token * work.prefill_tokens
            + self.decode_ms_per_seq * work.decode_seqs
            + self.decode_ms_per_1k_context * work.context_tokens / 1000.0
            + self.lora_load_ms * work.lora_loads
        )
