"""Client configuration as controller-runtime finds it, with errors that say what is missing."""

from __future__ import annotations

import pathlib

import pytest

from epp.errors import ConfigError
from epp.k8s.client import Kube, TokenBucket, load_configuration, resource_path
from epp_kubeapi import KubeApiServer


async def test_no_configuration_anywhere(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"no Kubernetes client configuration.*--kubeconfig, \$KUBECONFIG"):
        await load_configuration("", {"HOME": str(tmp_path)})


async def test_bad_kubeconfig_names_the_file(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(ConfigError, match=str(bad)):
        await load_configuration(str(bad), {})
    with pytest.raises(ConfigError, match="missing"):
        await load_configuration(str(tmp_path / "missing"), {})


async def test_flag_then_env_then_home(api: KubeApiServer, tmp_path: pathlib.Path) -> None:
    flag = api.write_kubeconfig(tmp_path / "flag")
    env = api.write_kubeconfig(tmp_path / "env")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    api.write_kubeconfig(home / ".kube" / "config")
    assert (await load_configuration(str(flag), {"KUBECONFIG": str(env)}))[1] == f"kubeconfig {flag}"
    assert (await load_configuration("", {"KUBECONFIG": f"{env}:{flag}"}))[1] == f"kubeconfig {env}"
    assert (await load_configuration("", {"HOME": str(home)}))[1] == f"kubeconfig {home / '.kube' / 'config'}"


async def test_requests_carry_the_bearer_token(api: KubeApiServer, tmp_path: pathlib.Path) -> None:
    kube = await Kube.connect(str(api.write_kubeconfig(tmp_path / "kc", token="sa-token")), {})
    try:
        body = await kube.json("GET", "/api/v1/namespaces/default/pods")
        assert body["kind"] == "PodList"
        assert api.requests[-1].username == "sa-token"
    finally:
        await kube.close()


def test_resource_paths() -> None:
    assert resource_path("", "v1", "pods", "ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert (
        resource_path("coordination.k8s.io", "v1", "leases", "ns")
        == "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
    )


async def test_token_bucket_allows_a_burst_then_paces() -> None:
    bucket = TokenBucket(rate=1000.0, burst=3)
    for _ in range(3):
        await bucket.acquire()
    assert bucket._tokens < 1.0  # the burst is spent; the next acquire waits for a refill
    await bucket.acquire()
