"""Every manifest under deploy/kubernetes is one the API server would accept.

Built-in kinds are checked against Kubernetes' own OpenAPI schemas (kubernetes-validate,
bundled, strict), our custom resources against our CRDs' schemas and CEL rules, and the
Gateway API objects (whose CRDs we do not ship) by the pointed checks in test_wiring.py.
The negative cases prove each layer of the validator catches a broken manifest.
"""

from __future__ import annotations

import copy
import socket
from functools import cache
from typing import Any

import celpy
import jsonschema
import pytest

from tests.deploy.kustomize import KUBERNETES, build, load_documents, manifest_files
from tests.deploy.schemas import (
    KUBERNETES_VERSIONS,
    CrdVersion,
    SchemaMissing,
    crd_versions,
    validate_builtin,
    validate_custom,
)

GATEWAY_API = "gateway.networking.k8s.io/"

FILES = [p.relative_to(KUBERNETES).as_posix() for p in manifest_files()]


@cache
def our_crds() -> dict[tuple[str, str], CrdVersion]:
    return crd_versions(build(KUBERNETES / "crds"))


def errors_for(obj: dict[str, Any], version: str = KUBERNETES_VERSIONS[-1]) -> list[str]:
    try:
        return validate_custom(obj, our_crds())
    except SchemaMissing:
        return validate_builtin(obj, version)


def example(kind: str) -> dict[str, Any]:
    (obj,) = [o for o in build(KUBERNETES / "examples") if o["kind"] == kind]
    return copy.deepcopy(obj)


def example_objective() -> dict[str, Any]:
    objs = [o for o in build(KUBERNETES / "examples") if o["kind"] == "InferenceObjective"]
    return copy.deepcopy(objs[0])


def test_there_are_manifests() -> None:
    assert len(FILES) >= 10


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", FILES)
def test_manifest_validates(name: str, version: str) -> None:
    docs = load_documents(KUBERNETES / name)
    assert docs, f"{name} has no documents"
    for obj in docs:
        if str(obj.get("apiVersion", "")).startswith(GATEWAY_API):
            continue  # no schema offline; see test_wiring.py
        assert errors_for(obj, version) == [], f"{name}: {obj['kind']}/{obj['metadata']['name']}"


def test_every_kind_is_validated_by_a_schema() -> None:
    """Only the Gateway API kinds go without a schema; anything else unknown is an error."""
    for path in manifest_files():
        for obj in load_documents(path):
            if str(obj["apiVersion"]).startswith(GATEWAY_API):
                assert obj["kind"] in ("GatewayClass", "Gateway", "HTTPRoute")
                continue
            try:
                validate_custom(obj, our_crds())
            except SchemaMissing:
                validate_builtin(obj, KUBERNETES_VERSIONS[-1])  # raises SchemaMissing if unknown


def test_crds_define_what_the_epp_reads() -> None:
    crds = our_crds()
    assert set(crds) == {
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"),
    }
    by_kind = {o["spec"]["names"]["kind"]: o for o in build(KUBERNETES / "crds")}
    pool = by_kind["InferencePool"]
    assert pool["spec"]["names"]["shortNames"] == ["infpool"]
    assert pool["metadata"]["annotations"]["api-approved.kubernetes.io"].startswith("https://")
    for crd in by_kind.values():
        assert crd["spec"]["scope"] == "Namespaced"
        (version,) = crd["spec"]["versions"]
        assert version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}


# --- negative cases: a broken custom resource is caught ----------------------------------------


def pool_with(**spec: Any) -> dict[str, Any]:
    pool = example("InferencePool")
    pool["spec"].update(spec)
    return pool


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (pool_with(targetPorts=[{"number": 8000}, {"number": 8000}]), "port number must be unique"),
        (pool_with(targetPorts=[{"number": 8000 + i} for i in range(9)]), "is too long"),
        (pool_with(targetPorts=[]), "should be non-empty"),
        (pool_with(targetPorts=[{"number": 0}]), "less than the minimum of 1"),
        (pool_with(targetPorts=[{"number": 70000}]), "greater than the maximum of 65535"),
        (pool_with(targetPorts=[{"port": 8000}]), "'number' is a required property"),
        (pool_with(targetPorts=8000), "is not of type 'array'"),
        (pool_with(selector={"matchLabels": {}}), "should be non-empty"),
        (pool_with(selector={"app": "x"}), "'matchLabels' is a required property"),
        (pool_with(appProtocol="grpc"), "is not one of"),
        (pool_with(endpointPickerRef={"name": "epp"}), "port is required when kind is 'Service'"),
        (
            pool_with(endpointPickerRef={"name": "epp", "port": {"number": 9002}, "failureMode": "Open"}),
            "is not one of",
        ),
        (pool_with(targetPort=[{"number": 8000}]), "Additional properties are not allowed"),
    ],
)
def test_a_broken_inferencepool_is_rejected(broken: dict[str, Any], expected: str) -> None:
    errors = errors_for(broken)
    assert any(expected in e for e in errors), errors


def test_defaults_are_applied_before_the_cel_rules() -> None:
    """endpointPickerRef.kind defaults to Service, so the port rule applies without it."""
    pool = pool_with(endpointPickerRef={"name": "epp", "port": {"number": 9002}})
    assert errors_for(pool) == []
    pool["spec"]["endpointPickerRef"] = {"name": "picker", "kind": "Picker", "group": "example.com"}
    assert errors_for(pool) == []


@pytest.mark.parametrize(
    ("kind", "change", "expected"),
    [
        ("InferenceObjective", {"priority": "high"}, "is not of type 'integer'"),
        ("InferenceObjective", {"poolRef": {}}, "'name' is a required property"),
        ("InferenceObjective", {"pool": "x"}, "Additional properties are not allowed"),
        ("InferenceModelRewrite", {"rules": [{"targets": []}]}, "should be non-empty"),
        (
            "InferenceModelRewrite",
            {"rules": [{"targets": [{"modelRewrite": "m", "weight": 0}]}]},
            "less than the minimum of 1",
        ),
        (
            "InferenceModelRewrite",
            {"rules": [{"targets": [{"modelRewrite": "m", "weight": 1000001}]}]},
            "greater than the maximum",
        ),
        (
            "InferenceModelRewrite",
            {
                "rules": [
                    {
                        "matches": [{"model": {"type": "Prefix", "value": "q"}}],
                        "targets": [{"modelRewrite": "m"}],
                    }
                ]
            },
            "is not one of",
        ),
    ],
)
def test_broken_objectives_and_rewrites_are_rejected(
    kind: str, change: dict[str, Any], expected: str
) -> None:
    obj = example(kind) if kind != "InferenceObjective" else example_objective()
    obj["spec"].update(change)
    errors = errors_for(obj)
    assert any(expected in e for e in errors), errors


def test_a_resource_of_an_unserved_or_unknown_version_is_rejected() -> None:
    pool = example("InferencePool")
    pool["apiVersion"] = "inference.networking.x-k8s.io/v1alpha2"
    with pytest.raises(SchemaMissing):
        validate_custom(pool, our_crds())


# --- negative cases: a broken built-in object is caught ----------------------------------------


def epp_deployment() -> dict[str, Any]:
    (obj,) = [o for o in build(KUBERNETES / "epp") if o["kind"] == "Deployment"]
    return copy.deepcopy(obj)


def test_a_typo_in_a_deployment_is_rejected() -> None:
    deployment = epp_deployment()
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 9003}}
    assert errors_for(deployment) != []


def test_a_wrong_type_in_a_deployment_is_rejected() -> None:
    deployment = epp_deployment()
    deployment["spec"]["replicas"] = "two"
    assert errors_for(deployment) != []


def test_a_missing_required_field_is_rejected() -> None:
    deployment = epp_deployment()
    del deployment["spec"]["template"]["spec"]["containers"][0]["name"]
    assert errors_for(deployment) != []


def test_an_unknown_builtin_kind_is_not_silently_accepted() -> None:
    with pytest.raises(SchemaMissing):
        validate_builtin(
            {"apiVersion": "v1", "kind": "Podd", "metadata": {"name": "x"}}, KUBERNETES_VERSIONS[-1]
        )


def test_the_validators_work_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate reads its schemas from the installed package, never the network."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the validator tried to open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    assert errors_for(epp_deployment()) == []
    assert errors_for(example("InferencePool")) == []


def schema_nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += schema_nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += schema_nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += schema_nodes(schema["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("kind", ["InferencePool", "InferenceObjective", "InferenceModelRewrite"])
def test_crd_schema_is_structural(kind: str) -> None:
    """What the API server demands of a CRD schema beyond its OpenAPI shape."""
    (crd,) = [c for c in our_crds().values() if c.kind == kind]
    for path, node in schema_nodes(crd.schema):
        assert "type" in node, f"{path}: every node of a structural schema has a type"
        if "default" in node:  # defaults must pass their own schema
            assert list(jsonschema.Draft7Validator(node).iter_errors(node["default"])) == [], path
        for key in node.get("x-kubernetes-list-map-keys", []):
            item = node["items"]
            assert key in item.get("required", []) or "default" in item["properties"][key], path
        for rule in node.get("x-kubernetes-validations", []):
            celpy.Environment().compile(rule["rule"])  # every CEL rule compiles, even on absent fields
            assert rule["message"]
    assert set(crd.schema["properties"]["metadata"]) == {"type"}  # metadata: only `type: object` allowed
