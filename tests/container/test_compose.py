"""docker/compose.yaml: valid by the compose specification, and naming only what exists.

Every build names a Dockerfile and a stage that exist, every bind mount a file
that exists; the kvscope services set only settings the sidecar reads, with
values it accepts, and publish the port it binds; vLLM's command line and the
sidecar's settings meet on the same endpoints; Prometheus' scrape targets
(docker/prometheus/prometheus.yml) are services of each profile; Grafana gets
the data source and the dashboards (dashboards/) they were written for. No
container runs here: the compose file's images need a registry (Prometheus,
Grafana, vLLM) or a GPU; test_image.py runs the sidecar image itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.container.conftest import SettingsFromEnv
from tests.container.manifests import (
    COMPOSE,
    DOCKER_DIR,
    DOCKERFILE,
    GRAFANA_PROVISIONING,
    KVSCOPE_IMAGES,
    PROMETHEUS_CONFIG,
    ROOT,
    VllmCommand,
    compose,
    image_settings_env,
    instructions,
    network_names,
    services_in_profile,
    setting_variables,
    spec_accepts,
    version,
    wiring_problems,
)

CHECK_JSONSCHEMA = shutil.which(
    "check-jsonschema", path=str(Path(sys.executable).parent)
) or shutil.which("check-jsonschema")
FULL, DEMO = "vllm", "demo"
PROFILES = (FULL, DEMO)
VLLM_PORT = 8000
"""vLLM's default HTTP port (the compose file's vllm service sets none)."""
PROMETHEUS_PORT = 9090


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, PurePosixPath]]:
    """(host path, container path) of each bind mount; named volumes left out."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((DOCKER_DIR / source).resolve(), PurePosixPath(target)))
    return mounts


def host_path(service: dict[str, Any], inside: str) -> Path | None:
    """Where a path inside the service's container comes from on this side, if mounted."""
    path = PurePosixPath(inside)
    for source, target in sorted(bind_mounts(service), key=lambda m: -len(m[1].parts)):
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    return None


def kvscope_env(service: dict[str, Any]) -> dict[str, str]:
    return {
        k: str(v) for k, v in service.get("environment", {}).items() if k.startswith("KVSCOPE_")
    }


def published_ports(service: dict[str, Any]) -> set[int]:
    """The container side of each published port."""
    return {int(str(port).rsplit(":", 1)[-1]) for port in service.get("ports", [])}


def serving_port(name: str, service: dict[str, Any]) -> int:
    """The port a service's HTTP server binds inside its container."""
    build = service.get("build", {})
    if (
        DOCKER_DIR / build.get("context", ".") / build.get("dockerfile", "")
    ).resolve() == DOCKERFILE:
        env = {**image_settings_env(build["target"]), **kvscope_env(service)}
        return int(env["KVSCOPE_PORT"])
    assert name == "vllm", f"{name}: no known HTTP port"
    return VLLM_PORT


def test_compose_file_is_valid_by_the_compose_specification() -> None:
    assert CHECK_JSONSCHEMA is not None, "check-jsonschema (dev extra) not installed"
    result = subprocess.run(
        [CHECK_JSONSCHEMA, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_build_and_bind_mount_names_something_that_exists() -> None:
    declared_volumes = set(compose().get("volumes", {}))
    for name, service in services().items():
        build = service.get("build")
        if build is not None:
            context = (DOCKER_DIR / build["context"]).resolve()
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile.is_file(), f"{name}: no {dockerfile}"
            if "target" in build:
                stages = {i.stage for i in instructions(dockerfile)}
                assert build["target"] in stages, f"{name}: no stage {build['target']}"
            key = (dockerfile.name, build.get("target"))
            assert service["image"] == f"{KVSCOPE_IMAGES[key]}:{version()}", name
        for source, _ in bind_mounts(service):
            assert source.exists(), f"{name} mounts {source}, which is missing"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared_volumes, f"{name}: volume {source} is not declared"


@pytest.mark.parametrize("name", ["kvscope", "kvscope-demo"])
def test_sidecar_services_set_settings_it_reads_and_publish_its_port(name: str) -> None:
    """The demo's publisher is its own (``kvscope demo`` connects to it), so its
    settings are checked here by name and port; the sidecar's whole, with vLLM's."""
    service = services()[name]
    env = kvscope_env(service)
    assert set(env) <= setting_variables(), set(env) - setting_variables()
    assert published_ports(service) == {serving_port(name, service)}
    assert service.get("read_only") is True and service.get("cap_drop") == ["ALL"]


def test_the_demo_profile_needs_no_gpu_and_no_vllm() -> None:
    demo = services_in_profile(DEMO)
    assert "vllm" not in demo
    assert not [n for n, s in demo.items() if "deploy" in s], "a demo service reserves devices"
    assert {"kvscope-demo", "prometheus", "grafana"} <= set(demo)
    assert {"vllm", "kvscope", "prometheus", "grafana"} <= set(services_in_profile(FULL))


def test_vllm_and_the_sidecar_meet_on_the_same_endpoints(
    settings_from_env: SettingsFromEnv,
) -> None:
    vllm = VllmCommand.parse(services()["vllm"]["command"])
    sidecar = settings_from_env({**image_settings_env(), **kvscope_env(services()["kvscope"])})
    assert wiring_problems(vllm, sidecar, vllm_host="vllm", sidecar_host="kvscope") == []
    assert "--port" not in services()["vllm"]["command"]
    assert published_ports(services()["vllm"]) == {VLLM_PORT}


def scrape_targets() -> dict[str, list[str]]:
    """Each scrape job of docker/prometheus/prometheus.yml and its static targets."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    return {
        job["job_name"]: [t for c in job.get("static_configs", []) for t in c["targets"]]
        for job in config["scrape_configs"]
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_scrapes_services_of_the_profile_on_their_ports(profile: str) -> None:
    """All of them with vLLM; the demo has no vLLM, so there the kvscope job alone."""
    running = services_in_profile(profile)
    answering = {
        host: name for name, service in running.items() for host in network_names(name, service)
    }
    for job, targets in scrape_targets().items():
        if profile == DEMO and job != "kvscope":
            continue
        for target in targets:
            host, port = target.rsplit(":", 1)
            assert host in answering, f"{profile}: job {job} scrapes {host}, no such service"
            service = running[answering[host]]
            serving = serving_port(answering[host], service)
            assert int(port) == serving, f"{profile}: {target} is not where {host} serves"


def test_prometheus_mounts_its_config_and_every_rule_file() -> None:
    prometheus = services()["prometheus"]
    command = dict(arg.split("=", 1) for arg in prometheus["command"])
    config_inside = PurePosixPath(command["--config.file"])
    assert host_path(prometheus, str(config_inside)) == PROMETHEUS_CONFIG
    rule_globs = yaml.safe_load(PROMETHEUS_CONFIG.read_text()).get("rule_files", [])
    assert rule_globs, "prometheus.yml loads no rules"
    for pattern in rule_globs:
        inside = config_inside.parent / pattern  # relative to the config file, as Prometheus reads
        directory = host_path(prometheus, str(inside.parent))
        assert directory is not None, f"{inside.parent} is not mounted"
        assert sorted(directory.glob(inside.name)), f"no rule files match {inside}"


def grafana_provisioning(kind: str) -> list[dict[str, Any]]:
    return [
        yaml.safe_load(path.read_text())
        for path in sorted((GRAFANA_PROVISIONING / kind).glob("*.yaml"))
    ]


def datasource_refs(node: Any) -> list[dict[str, Any]]:
    """Every ``datasource`` reference in a dashboard, panels and variables alike."""
    if isinstance(node, list):
        return [ref for item in node for ref in datasource_refs(item)]
    if not isinstance(node, dict):
        return []
    own = [node["datasource"]] if isinstance(node.get("datasource"), dict) else []
    return own + [ref for value in node.values() for ref in datasource_refs(value)]


def test_grafana_gets_the_prometheus_data_source_and_the_dashboards() -> None:
    grafana = services()["grafana"]
    assert host_path(grafana, "/etc/grafana/provisioning") == GRAFANA_PROVISIONING
    (datasources,) = [d["datasources"] for d in grafana_provisioning("datasources")]
    (datasource,) = datasources
    assert datasource["url"] == f"http://prometheus:{PROMETHEUS_PORT}"
    assert "--web.listen-address" not in " ".join(services()["prometheus"]["command"])
    (providers,) = [d["providers"] for d in grafana_provisioning("dashboards")]
    (provider,) = providers
    dashboards = host_path(grafana, provider["options"]["path"])
    assert dashboards == ROOT / "dashboards"
    files = sorted(dashboards.glob("*.json"))
    assert files, "no dashboards to provision"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_path(grafana, home) in files


def test_every_dashboard_query_reaches_the_provisioned_data_source() -> None:
    """A fixed uid must be the provisioned one; a ``${var}`` must be a data source variable
    of the provisioned type (file provisioning fills no ``__inputs``)."""
    (datasources,) = [d["datasources"] for d in grafana_provisioning("datasources")]
    uids = {d["uid"] for d in datasources}
    types = {d["type"] for d in datasources}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        assert "__inputs" not in dashboard, f"{path.name} is an export with inputs"
        variables = {
            v["name"]: v["query"]
            for v in dashboard.get("templating", {}).get("list", [])
            if v["type"] == "datasource"
        }
        for ref in datasource_refs(dashboard):
            uid = ref.get("uid", "")
            if uid.startswith("$"):
                name = uid.strip("${}")
                assert variables.get(name) in types, f"{path.name}: {uid} picks no provisioned type"
            else:
                assert uid in uids or ref.get("type") == "grafana", f"{path.name}: {ref}"


def test_compose_vllm_config_is_accepted_by_kvscopes_spec() -> None:
    spec_accepts(VllmCommand.parse(services()["vllm"]["command"]).extra_config)
