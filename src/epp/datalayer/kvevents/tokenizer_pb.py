"""The protobuf wire format of llm-d-kv-cache's UDS tokenizer service (api/tokenizerpb/tokenizer.proto,
package ``tokenization``), for the messages the EPP exchanges with it.

Hand-written rather than generated: four request/response pairs of strings, bools and packed
uint32 lists do not justify a build step, and a schema here is checked against the proto's field
numbers by the tests.  A schema maps a field number to ``(name, kind)``; kinds are ``str``,
``bool``, ``u32s`` (repeated uint32, packed on the wire, either form read), ``msg`` / ``msgs``
(a nested schema, once or repeated).  Absent fields decode to their proto3 default; an
``optional`` field is sent only when present in the dict.
"""

from __future__ import annotations

from typing import Any, Final

Schema = dict[int, tuple[str, str, "Schema | None"]]

SERVICE: Final = "/tokenization.TokenizationService/"

IMAGE_URL: Final[Schema] = {1: ("url", "str", None)}
CONTENT_PART: Final[Schema] = {
    1: ("type", "str", None),
    2: ("text", "str", None),
    3: ("image_url", "msg", IMAGE_URL),
}
CHAT_MESSAGE: Final[Schema] = {
    1: ("role", "str", None),
    2: ("content", "str", None),
    3: ("content_parts", "msgs", CONTENT_PART),
    4: ("tool_calls_json", "str", None),
}
INITIALIZE_REQUEST: Final[Schema] = {
    1: ("model_name", "str", None),
    2: ("enable_thinking", "bool", None),
    3: ("add_generation_prompt", "bool", None),
}
INITIALIZE_RESPONSE: Final[Schema] = {1: ("success", "bool", None), 2: ("error_message", "str", None)}
RENDER_COMPLETION_REQUEST: Final[Schema] = {1: ("model_name", "str", None), 2: ("prompt", "str", None)}
RENDER_COMPLETION_RESPONSE: Final[Schema] = {
    1: ("request_id", "str", None),
    2: ("token_ids", "u32s", None),
    3: ("success", "bool", None),
    4: ("error_message", "str", None),
}
RENDER_CHAT_REQUEST: Final[Schema] = {
    1: ("model_name", "str", None),
    2: ("messages", "msgs", CHAT_MESSAGE),
    3: ("tools_json", "str", None),
    4: ("chat_template", "str", None),
    5: ("add_generation_prompt", "bool", None),
    6: ("continue_final_message", "bool", None),
    7: ("chat_template_kwargs", "str", None),
}
RENDER_CHAT_RESPONSE: Final[Schema] = {
    1: ("request_id", "str", None),
    2: ("token_ids", "u32s", None),
    # 3: features (multimodal placeholders): skipped, the EPP hashes text blocks only
    4: ("success", "bool", None),
    5: ("error_message", "str", None),
}

_DEFAULTS: Final[dict[str, Any]] = {"str": "", "bool": False, "msg": None}


class ProtoError(ValueError):
    """Bytes that are not a message of the expected schema."""


def _varint(value: int, out: bytearray) -> None:
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtoError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _bytes_field(number: int, payload: bytes, out: bytearray) -> None:
    _varint(number << 3 | 2, out)
    _varint(len(payload), out)
    out += payload


def encode(schema: Schema, message: dict[str, Any]) -> bytes:
    """``message`` (names as in the schema) in protobuf wire format; None values are left out."""
    out = bytearray()
    for number, (name, kind, sub) in schema.items():
        value = message.get(name)
        if value is None:
            continue
        if kind == "str":
            _bytes_field(number, str(value).encode(), out)
        elif kind == "bool":
            _varint(number << 3, out)
            out.append(1 if value else 0)
        elif kind == "u32s":
            packed = bytearray()
            for v in value:
                _varint(int(v), packed)
            _bytes_field(number, bytes(packed), out)
        elif kind == "msg":
            assert sub is not None
            _bytes_field(number, encode(sub, value), out)
        else:  # msgs
            assert sub is not None
            for item in value:
                _bytes_field(number, encode(sub, item), out)
    return bytes(out)


def decode(schema: Schema, data: bytes) -> dict[str, Any]:
    """A message of ``schema`` from wire bytes; unknown fields are skipped, as protobuf does."""
    message: dict[str, Any] = {
        name: [] if kind in ("u32s", "msgs") else _DEFAULTS[kind] for name, kind, _ in schema.values()
    }
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        field = schema.get(number)
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if field is not None:
                name, kind, _ = field
                if kind == "u32s":
                    message[name].append(value)
                else:
                    message[name] = bool(value) if kind == "bool" else value
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ProtoError("truncated field")
            chunk = data[pos : pos + length]
            pos += length
            if field is None:
                continue
            name, kind, sub = field
            if kind == "str":
                message[name] = chunk.decode()
            elif kind == "u32s":
                i = 0
                while i < len(chunk):
                    v, i = _read_varint(chunk, i)
                    message[name].append(v)
            elif kind == "msg":
                assert sub is not None
                message[name] = decode(sub, chunk)
            elif kind == "msgs":
                assert sub is not None
                message[name].append(decode(sub, chunk))
            else:
                raise ProtoError(f"field {number} ({name}) has wire type 2, expected a varint")
        elif wire == 5:
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ProtoError(f"unsupported wire type {wire}")
    return message
