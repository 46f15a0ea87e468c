"""The Kubernetes manifests of contrib/k8s (issue 18 item 3), without a cluster.

Every manifest validates, strictly (unknown fields refused), against the Kubernetes OpenAPI
schemas that the ``kubernetes-validate`` package ships, for the oldest and the newest release
it is pinned to here; then the manifests are cross-checked against each other and against
Pharos: the ConfigMap's config passes ``pharos check`` once its placeholder keys are filled,
with the Secret's peer secret where the Deployment mounts it, ``peers.dns`` names the
headless Service, probes and Services use the config's ports, the grace period covers the
drain, and every selector finds the pods.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pharos.config import load_config
from pharos.proxy.auth import new_key

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (setup.cfg's test extra)")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "contrib/k8s"
PHAROS = str(Path(sys.executable).parent / "pharos")
#: The oldest Kubernetes release the manifests are checked against (policy/v1 PDBs, all the
#: fields used) and the newest the installed package knows.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
#: The image's user (Dockerfile: USER 10001:10001) and the path its CMD reads.
IMAGE_UID = 10001
IMAGE_CONFIG = "/etc/pharos/pharos.yaml"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file name, resource) for every resource the kustomization lists, in its order."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc is not None:
                out.append((name, doc))
    return out


def validate(resource: dict[str, Any], version: str) -> str | None:
    """kubernetes-validate's message for ``resource`` at ``version`` (strict), or None."""
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path) or "(top)"
        return f"{resource.get('kind')}/{resource.get('metadata', {}).get('name')}: " \
               f"{where}: {e.message} (Kubernetes {version})"
    return None


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [r for _, r in manifests() if r["kind"] == kind]


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [r for r in by_kind(kind) if name is None or r["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def test_kustomization_lists_every_manifest() -> None:
    """``kubectl apply -k contrib/k8s`` applies every YAML file of the directory."""
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    """Every resource validates strictly against the OpenAPI schemas of ``version`` (the
    validator's messages fail the test)."""
    problems = [p for _, r in manifests() if (p := validate(r, version)) is not None]
    if problems:
        pytest.fail("\n".join(problems))


def test_a_broken_manifest_fails_with_the_validators_message() -> None:
    """A misspelt field and a grace period given as a string are refused, with
    kubernetes-validate's message naming the field."""
    deployment = the("Deployment")
    deployment["spec"]["strategy"]["rollingUpdate"]["maxSurg"] = 1
    problem = validate(deployment, VERSIONS[-1])
    assert problem is not None and "'maxSurg' was unexpected" in problem, problem
    deployment = the("Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "150s"
    problem = validate(deployment, VERSIONS[-1])
    assert problem is not None and "terminationGracePeriodSeconds" in problem, problem


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = the("Deployment")["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    (c,) = pod_spec()["containers"]
    return dict(c)


def mount_of(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volumeMount whose directory holds ``path`` and the pod volume it mounts."""
    (mount,) = [m for m in container()["volumeMounts"]
                if posixpath.dirname(path) == m["mountPath"]]
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == mount["name"]]
    return mount, volume


#: The ConfigMap's key entries: placeholders ``pharos check`` refuses.
PLACEHOLDER = '"<sha256 from pharos keys new>"'


def configmap_config(tmp_path: Path, fill_keys: bool = True) -> Path:
    """The ConfigMap's config as the pod sees it, with the Secret's peer secret written where
    the config names it (moved under ``tmp_path``): what ``pharos check`` reads in the pod.
    ``fill_keys``: each placeholder key entry replaced by a fresh key's digest, as the
    operator following the comments does."""
    text = the("ConfigMap")["data"]["pharos.yaml"]
    if fill_keys:
        text = re.sub(re.escape(PLACEHOLDER), lambda m: new_key()[1], text)
    secret_file = yaml.safe_load(text)["peers"]["secret_file"]
    mount, volume = mount_of(secret_file)
    secret = the("Secret", volume["secret"]["secretName"])
    (item,) = [i for i in volume["secret"]["items"]
               if posixpath.join(mount["mountPath"], i["path"]) == secret_file]
    local = tmp_path / "peer-secret"
    local.write_text(secret["stringData"][item["key"]])
    cfg = tmp_path / "pharos.yaml"
    cfg.write_text(text.replace(secret_file, str(local)))
    return cfg


def test_configmap_config_passes_pharos_check(tmp_path: Path) -> None:
    """The ConfigMap's pharos.yaml, mounted at the image CMD's path, is refused by ``pharos
    check`` as shipped (its key entries are placeholders: the message names the field and
    ``pharos keys new``), and passes once each holds a key's digest, with the peer secret
    read from the Secret item the Deployment mounts at ``peers.secret_file``; an empty
    secret fails it."""
    mount, volume = mount_of(IMAGE_CONFIG)
    assert volume["configMap"]["name"] == the("ConfigMap")["metadata"]["name"]
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates (hot reload)"
    shipped = configmap_config(tmp_path, fill_keys=False)
    r = subprocess.run([PHAROS, "check", "-c", str(shipped)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, r.stdout
    assert "keys[0].sha256" in r.stderr and "keys[1].sha256" in r.stderr, r.stderr
    assert "pharos keys new" in r.stderr, r.stderr
    cfg = configmap_config(tmp_path)
    r = subprocess.run([PHAROS, "check", "-c", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    (tmp_path / "peer-secret").write_text("\n")
    r = subprocess.run([PHAROS, "check", "-c", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "peers.secret_file" in r.stderr, r.stderr


def test_secret_keys_name_the_configs_keys_and_are_placeholders(tmp_path: Path) -> None:
    """Each client key in the Secret is named after a key of the config, and both are
    placeholders (no example key anyone could copy and use), and the pods mount the peer
    secret alone, readable by the image's user only."""
    cfg = load_config(configmap_config(tmp_path))
    secret = the("Secret")
    keys = {k: v for k, v in secret["stringData"].items() if k.startswith("key-")}
    assert {f"key-{k.name}" for k in cfg.keys} == set(keys)
    assert all(value.startswith("<") for value in keys.values()), keys
    assert the("ConfigMap")["data"]["pharos.yaml"].count(PLACEHOLDER) == len(cfg.keys)
    (volume,) = [v for v in pod_spec()["volumes"] if "secret" in v]
    assert [i["key"] for i in volume["secret"]["items"]] == ["peer-secret"]
    assert volume["secret"]["defaultMode"] & 0o007 == 0
    assert pod_spec()["securityContext"]["fsGroup"] == IMAGE_UID


def test_deployment_rolls_one_at_a_time_and_outlasts_the_drain(tmp_path: Path) -> None:
    """maxUnavailable 0 and maxSurge 1; terminationGracePeriodSeconds above the config's
    drain grace + timeout; readiness on /healthz at the config's listen port; the pod runs as
    the image's non-root user."""
    deployment = the("Deployment")
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxUnavailable"], rolling["maxSurge"]) == (0, 1)
    cfg = load_config(configmap_config(tmp_path))
    assert pod_spec()["terminationGracePeriodSeconds"] > cfg.drain.grace + cfg.drain.timeout
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert cfg.peers is not None
    assert ports == {"http": cfg.listen.port(), "peer": cfg.peers.listen.port()}
    probe = container()["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == cfg.listen.port()
    security = pod_spec()["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == IMAGE_UID
    assert "command" not in container() and "args" not in container(), "the image's CMD runs"


def test_services_and_pdb_select_the_pods_and_peers_dns_is_the_headless_service(
        tmp_path: Path) -> None:
    """The client Service and the headless one select the Deployment's pods; ``peers.dns`` is
    the headless Service's full name (twisted.names uses no search domains), which lists
    not-ready pods and serves the peer port; the PDB selects the pods and lets one go."""
    deployment = the("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    cfg = load_config(configmap_config(tmp_path))
    assert cfg.peers is not None and cfg.peers.dns is not None
    services = by_kind("Service")
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert service["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    (headless,) = [s for s in services if s["spec"].get("clusterIP") == "None"]
    namespace = headless["metadata"]["namespace"]
    assert cfg.peers.dns == f"{headless['metadata']['name']}.{namespace}.svc.cluster.local"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert [(p["port"], p["targetPort"]) for p in headless["spec"]["ports"]] == [
        (cfg.peers.listen.port(), "peer")]
    (client,) = [s for s in services if s is not headless]
    assert [p["targetPort"] for p in client["spec"]["ports"]] == ["http"]
    pdb = the("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    namespaces = {r["metadata"].get("namespace") for _, r in manifests()
                  if r["kind"] != "Namespace"}
    assert namespaces == {the("Namespace")["metadata"]["name"]}
