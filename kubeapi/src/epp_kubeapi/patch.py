"""PATCH bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

Strategic merge patch is treated as a merge patch (they differ only on lists with merge
keys, which the EPP's objects do not rely on); server-side apply is refused with 415 so a
caller relying on it fails loudly instead of silently getting merge semantics.
"""

from __future__ import annotations

import copy
from typing import Any

from .status import ApiError

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def apply(content_type: str, target: dict[str, Any], patch: Any, *, custom: bool) -> dict[str, Any]:
    """Apply ``patch`` of ``content_type`` to a copy of ``target``.

    ``custom``: the resource is a CRD, for which the apiserver rejects strategic merge patch.
    """
    kind = content_type.split(";")[0].strip().lower()
    if kind == MERGE or (kind == STRATEGIC and not custom):
        if not isinstance(patch, dict):
            raise ApiError(400, "merge patch body must be a JSON object")
        result = merge_patch(target, patch)
        assert isinstance(result, dict)
        return result
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        return json_patch(target, patch)
    raise ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE}" + ("" if custom else f", {STRATEGIC}"),
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    """RFC 6902 add/remove/replace/move/copy/test; a failing op is a 422 like the apiserver's."""
    doc: Any = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"invalid JSON patch operation: {op!r}")
        name, path = op["op"], op["path"]
        if name == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif name == "remove":
            doc, _ = _remove(doc, path)
        elif name == "replace":
            doc, _ = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif name in ("move", "copy"):
            value = _get(doc, op.get("from", ""))
            if name == "move":
                doc, _ = _remove(doc, op["from"])
            doc = _add(doc, path, copy.deepcopy(value))
        elif name == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, f"the server rejected our request: test failed at {path}")
        else:
            raise ApiError(400, f"unknown JSON patch op {name!r}")
    if not isinstance(doc, dict):
        raise ApiError(422, "JSON patch replaced the whole object with a non-object")
    return doc


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, f"invalid JSON pointer {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise ApiError(422, "JSON patch cannot address the whole document here")
    node = doc
    for token in tokens[:-1]:
        node = _child(node, token, path)
    return node, tokens[-1]


def _child(node: Any, token: str, path: str) -> Any:
    try:
        if isinstance(node, list):
            return node[int(token)]
        return node[token]
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, f"the server rejected our request: path {path!r} does not exist") from None


def _get(doc: Any, path: str) -> Any:
    node = doc
    for token in _tokens(path):
        node = _child(node, token, path)
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    if not _tokens(path):
        return value
    parent, last = _parent(doc, path)
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if not 0 <= index <= len(parent):
            raise ApiError(422, f"the server rejected our request: index out of range at {path!r}")
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(422, f"the server rejected our request: cannot add at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    parent, last = _parent(doc, path)
    value = _child(parent, last, path)
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return doc, value
