"""The API resources the fake serves: what a path, an apiVersion+kind and discovery resolve to.

Registration is the fake's stand-in for installing a CRD: an unregistered group/version
answers 404 in discovery exactly like a cluster without that CRD, which is how the EPP
decides whether optional APIs (InferenceObjective) exist.
"""

from __future__ import annotations

from dataclasses import dataclass

CRUD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
CREATE_ONLY = ("create",)
INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_X_GROUP = "inference.networking.x-k8s.io"


@dataclass(frozen=True, slots=True)
class Resource:
    """One served resource (group, version, plural) and how it behaves.

    ``status_subresource``: HTTP writes to the main resource keep the stored status and
    ``/status`` writes change only the status, as for pods and GIE's CRDs.
    ``field_labels``: field selectors accepted beyond ``metadata.name``/``metadata.namespace``.
    ``virtual``: create-only review APIs (TokenReview, SubjectAccessReview) that store nothing.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = CRUD_VERBS
    status_subresource: bool = False
    field_labels: tuple[str, ...] = ()
    delete_returns_object: bool = True
    virtual: bool = False

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """``plural.group`` as apiserver messages name a resource (``pods`` for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    def discovery(self) -> list[dict[str, object]]:
        """The APIResource entries for this resource (and its ``/status``)."""
        entry: dict[str, object] = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        entries = [entry]
        if self.status_subresource:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)

BUILTINS = (
    Resource("", "v1", "pods", "Pod", short_names=("po",), status_subresource=True, field_labels=POD_FIELDS),
    Resource(
        "", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",), status_subresource=True
    ),
    Resource("", "v1", "events", "Event", short_names=("ev",), delete_returns_object=False),
    Resource("events.k8s.io", "v1", "events", "Event", short_names=("ev",), delete_returns_object=False),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", delete_returns_object=False),
    Resource(
        "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=CREATE_ONLY, virtual=True
    ),
    Resource(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        False,
        verbs=CREATE_ONLY,
        virtual=True,
    ),
)


def inference_crds(*, objectives: bool = True) -> list[Resource]:
    """GIE's CRDs: InferencePool v1 and v1alpha2, plus (optionally) the x-k8s.io v1alpha2 extras."""
    crds = [
        Resource(INFERENCE_GROUP, "v1", "inferencepools", "InferencePool", status_subresource=True),
        Resource(INFERENCE_X_GROUP, "v1alpha2", "inferencepools", "InferencePool", status_subresource=True),
    ]
    if objectives:
        crds += [
            Resource(
                INFERENCE_X_GROUP,
                "v1alpha2",
                "inferenceobjectives",
                "InferenceObjective",
                status_subresource=True,
            ),
            Resource(
                INFERENCE_X_GROUP,
                "v1alpha2",
                "inferencemodelrewrites",
                "InferenceModelRewrite",
                status_subresource=True,
            ),
        ]
    return crds


class Registry:
    """The served resources, by URL (group, version, plural) and by (apiVersion, kind)."""

    def __init__(self) -> None:
        self._by_path: dict[tuple[str, str, str], Resource] = {}
        self._by_kind: dict[tuple[str, str], Resource] = {}
        self._builtin: set[tuple[str, str, str]] = set()
        for resource in BUILTINS:
            self.add(resource)
            self._builtin.add(resource.key)

    def add(self, resource: Resource) -> None:
        """Serve ``resource`` (re-registering the same key replaces it)."""
        self._by_path[resource.key] = resource
        self._by_kind[(resource.api_version, resource.kind)] = resource

    def resolve(self, group: str, version: str, plural: str) -> Resource | None:
        return self._by_path.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> Resource:
        resource = self._by_kind.get((api_version, kind))
        if resource is None:
            raise KeyError(f"no resource registered for apiVersion {api_version!r} kind {kind!r}")
        return resource

    def is_builtin(self, resource: Resource) -> bool:
        return resource.key in self._builtin

    def resources(self, group: str, version: str) -> list[Resource]:
        return [r for r in self._by_path.values() if (r.group, r.version) == (group, version)]

    def groups(self) -> dict[str, list[str]]:
        """Named groups with their versions in registration order (the first is preferred)."""
        groups: dict[str, list[str]] = {}
        for group, version, _ in self._by_path:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        return groups
