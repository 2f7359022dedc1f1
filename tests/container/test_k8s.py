"""docker/k8s/: valid by Kubernetes' schemas, hardened, and wired as the images expect.

One pod holds vLLM and the kvscope sidecar, meeting on the pod's loopback;
a Service exposes it, and the pod's Prometheus scrape annotations (the only
ones: the Service has none) point at the sidecar's port.
The manifests are validated (strictly: no unknown field) against every
Kubernetes release from 1.29 on that kubernetes-validate knows, and
cross-checked against the sidecar image (its user, its settings, its probes)
and the compose file (the same images).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from app.settings import SidecarSettings
from tests.container.conftest import SettingsFromEnv
from tests.container.manifests import (
    DOCKERFILE,
    KVSCOPE_IMAGES,
    SIDECAR_TARGET,
    VLLM_DOCKERFILE,
    VllmCommand,
    container_env,
    image_settings_env,
    image_user,
    k8s_documents,
    k8s_object,
    pod_containers,
    setting_variables,
    spec_accepts,
    version,
    wiring_problems,
)

OLDEST = (1, 29)
VERSIONS = sorted(
    {v for v in all_versions() if tuple(int(n) for n in v.split(".")[:2]) >= OLDEST},
    key=lambda v: tuple(int(n) for n in v.split(".")),
)
LOOPBACK = "127.0.0.1"
SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics"}


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return list(k8s_documents())


@pytest.mark.parametrize("version_", VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(version_: str) -> None:
    assert documents(), "no manifests in docker/k8s"
    for path, document in documents():
        try:
            kubernetes_validate.validate(document, version_, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name} {document['kind']}: {exc.message} at {list(exc.path)}")


def pod_spec() -> dict[str, Any]:
    return k8s_object("Deployment")["spec"]["template"]["spec"]


def sidecar() -> dict[str, Any]:
    return pod_containers()["kvscope"]


def sidecar_settings(settings_from_env: SettingsFromEnv) -> SidecarSettings:
    """The settings the sidecar container runs with: the image's, then the manifest's."""
    return settings_from_env({**image_settings_env(), **container_env(sidecar())})


def test_pod_runs_non_root_as_the_image_user_with_read_only_roots() -> None:
    pod = pod_spec()
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert (context["runAsUser"], context["runAsGroup"]) == image_user()
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    volumes = {volume["name"] for volume in pod["volumes"]}
    for name, container in pod_containers().items():
        hardening = container["securityContext"]
        assert hardening["readOnlyRootFilesystem"] is True, name
        assert hardening["allowPrivilegeEscalation"] is False, name
        assert hardening["capabilities"] == {"drop": ["ALL"]}, name
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
        mounted = {mount["name"] for mount in container.get("volumeMounts", [])}
        assert mounted <= volumes, f"{name} mounts {mounted - volumes}, which the pod lacks"


def test_images_are_the_ones_compose_builds() -> None:
    containers = pod_containers()
    expected = {
        "kvscope": KVSCOPE_IMAGES[(DOCKERFILE.name, SIDECAR_TARGET)],
        "vllm": KVSCOPE_IMAGES[(VLLM_DOCKERFILE.name, None)],
    }
    assert {name: c["image"] for name, c in containers.items()} == {
        name: f"{image}:{version()}" for name, image in expected.items()
    }


def test_sidecar_sets_settings_it_reads_on_the_port_it_declares(
    settings_from_env: SettingsFromEnv,
) -> None:
    env = container_env(sidecar())
    assert set(env) <= setting_variables(), set(env) - setting_variables()
    settings = sidecar_settings(settings_from_env)
    assert [p["containerPort"] for p in sidecar()["ports"]] == [settings.port]
    assert settings.host == "0.0.0.0", "the kubelet probes the pod's address, not loopback"


def test_sidecar_is_probed_on_healthz_and_readyz_gates_no_traffic() -> None:
    """/healthz says the sidecar serves. /readyz (every publisher seen) must not be the
    pod's readiness: vLLM publishes only once it serves a request, which an unready
    pod never gets (docker/k8s/deployment.yaml says so)."""
    port_names = {port["name"] for port in sidecar()["ports"]}
    for probe in ("startupProbe", "livenessProbe"):
        http = sidecar()[probe]["httpGet"]
        assert (http["path"], http["port"] in port_names) == ("/healthz", True), probe
    assert "readinessProbe" not in sidecar()


def test_vllm_and_the_sidecar_meet_on_the_pods_loopback(
    settings_from_env: SettingsFromEnv,
) -> None:
    vllm = pod_containers()["vllm"]
    assert vllm["command"] == ["vllm", "serve"]
    command = VllmCommand.parse(vllm["args"])
    settings = sidecar_settings(settings_from_env)
    assert wiring_problems(command, settings, vllm_host=LOOPBACK, sidecar_host=LOOPBACK) == []
    bound = [
        command.extra_config["kvscope_endpoint"],
        command.extra_config["kvscope_replay_endpoint"],
        command.kv_events["replay_endpoint"],
        *settings.listen,
    ]
    assert all(f"//{LOOPBACK}:" in endpoint for endpoint in bound), "a ZMQ socket leaves the pod"
    http = {p["name"]: p["containerPort"] for p in vllm["ports"]}["http"]
    assert f"--port={http}" in vllm["args"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe


def test_k8s_vllm_config_is_accepted_by_kvscopes_spec_and_its_tier_fits_the_pod() -> None:
    vllm = pod_containers()["vllm"]
    extra_config = VllmCommand.parse(vllm["args"]).extra_config
    spec_accepts(extra_config)
    request = vllm["resources"]["requests"]["memory"]
    assert extra_config["cpu_bytes_to_use"] < quantity_bytes(request), "the tier outgrows the pod"


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in binary units (``48Gi``), in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_service_selects_the_pod_and_prometheus_scrapes_the_sidecar(
    settings_from_env: SettingsFromEnv,
) -> None:
    deployment = k8s_object("Deployment")
    service = k8s_object("Service")
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"] for c in pod_containers().values() for p in c["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in port_names, port
    scrape = {**SCRAPE, "prometheus.io/port": str(sidecar_settings(settings_from_env).port)}
    assert scrape.items() <= template["metadata"]["annotations"].items()
    # One set only: with the Service annotated too, a Prometheus running both a pods job
    # and a service-endpoints job scrapes each sidecar twice and every sum doubles.
    annotations = service["metadata"].get("annotations", {})
    assert not [key for key in annotations if key.startswith("prometheus.io/")], annotations
