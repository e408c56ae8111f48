"""What an endpoint's OpenAI-compatible ``/v1/models`` says it serves: base models and LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

MODELS_EXTRACTOR_TYPE: Final = "models-data-extractor"
# Upstream's attribute key (``/v1/models`` produced by the models extractor), for debug output.
MODELS_ATTRIBUTE_KEY: Final = f"/v1/models/{MODELS_EXTRACTOR_TYPE}"


class ModelsResponseError(ValueError):
    """A ``/v1/models`` body that is not the OpenAI list shape."""


@dataclass(frozen=True, slots=True)
class ModelData:
    """One ``data`` entry: a served model, or a LoRA adapter whose ``parent`` is its base model."""

    id: str
    object: str = ""
    created: int = 0
    owned_by: str = ""
    parent: str = ""


@dataclass(frozen=True, slots=True)
class ModelList:
    """A parsed ``/v1/models`` response."""

    object: str = ""
    data: tuple[ModelData, ...] = ()


def _text(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ModelsResponseError(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def parse_models(body: bytes) -> ModelList:
    """The response as upstream's ``json.Unmarshal`` into ``ModelResponse`` reads it.

    Unknown fields (vLLM's ``root``, ``max_model_len``, ``permission``) are ignored; ``null``
    is the zero value; a field of the wrong type or a body that is not JSON is an error.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ModelsResponseError(f"/v1/models: invalid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ModelsResponseError(f"/v1/models: expected an object, got {type(doc).__name__}")
    raw = doc.get("data")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ModelsResponseError(f"data: expected a list, got {type(raw).__name__}")
    models: list[ModelData] = []
    for i, entry in enumerate(raw):
        where = f"data[{i}]"
        if not isinstance(entry, dict):
            raise ModelsResponseError(f"{where}: expected an object, got {type(entry).__name__}")
        created = entry.get("created")
        if created is None:
            created = 0
        if isinstance(created, bool) or not isinstance(created, int):
            raise ModelsResponseError(f"{where}.created: expected an integer, got {type(created).__name__}")
        models.append(
            ModelData(
                id=_text(entry, "id", where),
                object=_text(entry, "object", where),
                created=created,
                owned_by=_text(entry, "owned_by", where),
                parent=_text(entry, "parent", where),
            )
        )
    return ModelList(object=_text(doc, "object", "/v1/models"), data=tuple(models))
