"""llm-d's P/D role label (``llm-d.ai/role``) and which values serve which stage.

One table for the role filters (``epp.scheduling.filters.by_label``) and for flow control's
per-stage saturation, verbatim from llm-d-router (``filter/bylabel/roles.go``,
``flowcontrol/controller/internal/processor.go``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from epp.datalayer.api import Endpoint

ROLE_LABEL: Final = "llm-d.ai/role"

DECODE: Final = "decode"
PREFILL: Final = "prefill"
ENCODE: Final = "encode"
PREFILL_DECODE: Final = "prefill-decode"
ENCODE_PREFILL: Final = "encode-prefill"
ENCODE_PREFILL_DECODE: Final = "encode-prefill-decode"
BOTH: Final = "both"  # deprecated spelling of prefill-decode

# filter type -> (accepted values, whether a pod without the label passes)
DECODE_VALUES: Final = frozenset({DECODE, PREFILL_DECODE, BOTH, ENCODE_PREFILL_DECODE})
PREFILL_VALUES: Final = frozenset({PREFILL, ENCODE_PREFILL, PREFILL_DECODE, BOTH, ENCODE_PREFILL_DECODE})
ENCODE_VALUES: Final = frozenset({ENCODE, ENCODE_PREFILL, ENCODE_PREFILL_DECODE})

_PREFILL_ONLY: Final = frozenset({PREFILL, ENCODE_PREFILL})
_DECODE_ONLY: Final = frozenset({DECODE, ""})
_INTERLEAVED: Final = frozenset({PREFILL_DECODE, BOTH, ENCODE_PREFILL_DECODE})


def serves_prefill(endpoint: Endpoint) -> bool:
    """Whether ``prefill-filter`` keeps ``endpoint`` (a labelled prefill role; unlabelled pods do not)."""
    return endpoint.metadata.labels.get(ROLE_LABEL, "") in PREFILL_VALUES


def partition(endpoints: Sequence[Endpoint]) -> tuple[list[Endpoint], list[Endpoint]] | None:
    """(prefill, decode) endpoints for per-stage saturation, or None when no endpoint has a
    prefill role (then the whole pool is the decode stage and nothing needs splitting).

    Unlabelled endpoints are decode; ``prefill-decode``/``both``/``encode-prefill-decode`` count
    in both stages; ``encode`` and unknown values in neither (no role filter sends them traffic).
    """
    prefill: list[Endpoint] = []
    decode: list[Endpoint] = []
    split = False
    for ep in endpoints:
        role = ep.metadata.labels.get(ROLE_LABEL, "")
        if role in _DECODE_ONLY:
            decode.append(ep)
        elif role in _PREFILL_ONLY:
            prefill.append(ep)
            split = True
        elif role in _INTERLEAVED:
            prefill.append(ep)
            decode.append(ep)
            split = True
        else:
            split = True  # encode or unknown: excluded from both stages
    return (prefill, decode) if split else None
