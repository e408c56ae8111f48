"""Validation of manifests the way an API server would, offline.

* Built-in kinds: ``kubernetes-validate``'s bundled OpenAPI schemas, strict (an unknown
  field is an error, as with ``kubectl apply --validate=strict``).
* Our custom resources: the ``openAPIV3Schema`` of our own CRDs with ``jsonschema``, after
  the API server's defaulting, with unknown fields rejected (the server would prune them, and
  strict field validation reports them), plus the CRDs' ``x-kubernetes-validations`` CEL rules
  evaluated with cel-python (the EPP's own dependency).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError

Obj = dict[str, Any]

KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
"""The oldest Kubernetes these manifests support (grpc probes GA in 1.27, preStop sleep beta in 1.30) and the newest schema bundled."""


class SchemaMissing(Exception):
    """No bundled schema for this apiVersion/kind (e.g. a CRD-defined kind)."""


def validate_builtin(obj: Obj, version: str) -> list[str]:
    """Errors for a built-in kind against Kubernetes ``version``'s schema; [] if valid."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError as e:
        raise SchemaMissing(e.message) from None
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        return [f"{path}: {e.message}"]
    return []


@dataclass(frozen=True)
class CrdVersion:
    group: str
    kind: str
    version: str
    served: bool
    schema: Obj


def crd_versions(crds: Sequence[Obj]) -> dict[tuple[str, str], CrdVersion]:
    """(apiVersion, kind) → the schema of that served version, for every CRD given."""
    out = {}
    for crd in crds:
        spec = crd["spec"]
        for v in spec["versions"]:
            api_version = f"{spec['group']}/{v['name']}"
            out[(api_version, spec["names"]["kind"])] = CrdVersion(
                spec["group"], spec["names"]["kind"], v["name"], v["served"], v["schema"]["openAPIV3Schema"]
            )
    return out


def closed(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever Kubernetes would drop unknown fields."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of ``value`` with the structural schema's defaults filled in, as the API server does."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in set(value) - set(schema.get("properties", {})):
                value[name] = apply_defaults(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [apply_defaults(schema["items"], v) for v in value]
    return value


_CEL = celpy.Environment()


def cel_errors(schema: Mapping[str, Any], value: Any, path: str = "") -> Iterator[str]:
    """Every ``x-kubernetes-validations`` rule that ``value`` breaks, with its message."""
    for rule in schema.get("x-kubernetes-validations", []):
        program = _CEL.program(_CEL.compile(rule["rule"]))
        try:
            ok = program.evaluate({"self": json_to_cel(value)})
        except CELEvalError as e:
            yield f"{path or '.'}: rule {rule['rule']!r} failed to evaluate: {e}"
            continue
        if not isinstance(ok, BoolType) or not bool(ok):
            yield f"{path or '.'}: {rule.get('message', rule['rule'])}"
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from cel_errors(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from cel_errors(schema["items"], item, f"{path}[{i}]")


def validate_custom(obj: Obj, crds: Mapping[tuple[str, str], CrdVersion]) -> list[str]:
    """Errors for a custom resource against our CRDs; [] if the API server would accept it."""
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    if key not in crds:
        raise SchemaMissing(f"no CRD defines {key}")
    crd = crds[key]
    if not crd.served:
        return [f"{key} is not served"]
    errors = []
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        errors.append("metadata.name: required")
    schema = crd.schema
    defaulted = apply_defaults(schema, obj)
    validator = jsonschema.Draft7Validator(closed(schema))
    for err in sorted(validator.iter_errors(defaulted), key=lambda e: list(e.absolute_path)):
        errors.append(f"{'.'.join(str(p) for p in err.absolute_path) or '.'}: {err.message}")
    if not errors:  # CEL runs only on objects that passed the schema, as in the API server
        errors.extend(cel_errors(schema, defaulted))
    return errors
