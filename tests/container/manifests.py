"""The container kit as the tests read it: the Dockerfiles, compose file and Kubernetes manifests.

Each file names things another file defines (an image's port and settings,
a build target, a mount source, the endpoints vLLM and the sidecar meet on);
these readers give the tests one view of them to cross-check, so a rename on
one side fails a test instead of a deployment.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from app.settings import SidecarSettings
from offload.cpu.config import positive_int

ROOT: Final = Path(__file__).resolve().parents[2]
DOCKER_DIR: Final = ROOT / "docker"
DOCKERFILE: Final = DOCKER_DIR / "Dockerfile"
VLLM_DOCKERFILE: Final = DOCKER_DIR / "vllm.Dockerfile"
DOCKERIGNORE: Final = ROOT / ".dockerignore"
COMPOSE: Final = DOCKER_DIR / "compose.yaml"
K8S_DIR: Final = DOCKER_DIR / "k8s"
PROMETHEUS_CONFIG: Final = DOCKER_DIR / "prometheus" / "prometheus.yml"
GRAFANA_PROVISIONING: Final = DOCKER_DIR / "grafana" / "provisioning"

SIDECAR_TARGET: Final = "sidecar"
DEMO_TARGET: Final = "demo"
KVSCOPE_IMAGES: Final = {
    (DOCKERFILE.name, SIDECAR_TARGET): "kvscope-sidecar",
    (DOCKERFILE.name, DEMO_TARGET): "kvscope-demo",
    (VLLM_DOCKERFILE.name, None): "kvscope-vllm",
}
"""The image each build makes, by (Dockerfile, target): compose, docker/k8s and the
README name these, tagged with kvscope's version."""


def version() -> str:
    """kvscope's version (pyproject.toml): the tag every kvscope image carries."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def setting_variables() -> set[str]:
    """Every environment variable the sidecar reads: ``KVSCOPE_`` and a settings field."""
    return {f"KVSCOPE_{name.upper()}" for name in SidecarSettings.model_fields}


# --- Dockerfiles


@dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined, in the stage it belongs to."""

    stage: str
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        """The JSON array form's words (``CMD ["serve"]``)."""
        words = json.loads(self.arguments)
        assert isinstance(words, list), f"{self.keyword} {self.arguments} is not in exec form"
        return words


def instructions(dockerfile: Path) -> list[Instruction]:
    """The file's instructions; those before the first FROM belong to stage ``""``."""
    found: list[Instruction] = []
    stage = ""
    pending = ""
    for line in dockerfile.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # Docker drops comment lines, also inside a continued instruction
        pending += line.rstrip().removesuffix("\\").strip() + " "
        if line.rstrip().endswith("\\"):
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        pending = ""
        keyword = keyword.upper()
        if keyword == "FROM":
            words = arguments.split()
            stage = words[2] if len(words) == 3 and words[1].upper() == "AS" else words[0]
        found.append(Instruction(stage, keyword, arguments.strip()))
    return found


def image_instructions(dockerfile: Path, target: str, *, copied: bool = False) -> list[Instruction]:
    """A target's image: its stage's instructions after those of the stages it is FROM.

    With ``copied``, also those of the stages it COPYs --from: what made its
    files, though not its configuration (user, environment, ports).
    """
    every = instructions(dockerfile)
    stages = {i.stage for i in every}
    own = [i for i in every if i.stage == target]
    assert own, f"{dockerfile.name} has no stage {target!r}"
    feeding = [own[0].arguments.split()[0]]
    if copied:
        feeding += [
            i.arguments.split()[0].removeprefix("--from=")
            for i in own
            if i.keyword == "COPY" and i.arguments.startswith("--from=")
        ]
    found: list[Instruction] = []
    for stage in feeding:
        if stage in stages:
            earlier = image_instructions(dockerfile, stage, copied=copied)
            found += [i for i in earlier if i not in found]
    return found + own


def in_effect(image: list[Instruction], keyword: str) -> Instruction:
    """The instruction of this kind that an image ends with: the last one in its stages."""
    found = [i for i in image if i.keyword == keyword]
    assert found, f"no {keyword} in the image"
    return found[-1]


def image_user(target: str = SIDECAR_TARGET) -> tuple[int, int]:
    """The uid and gid the image runs as (its USER, numeric)."""
    uid, _, gid = in_effect(image_instructions(DOCKERFILE, target), "USER").arguments.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {uid}:{gid} is not numeric"
    return int(uid), int(gid)


def last_stage(dockerfile: Path) -> str:
    """What a build without --target makes."""
    return instructions(dockerfile)[-1].stage


def env_of(stage: list[Instruction]) -> dict[str, str]:
    """``ENV`` settings of a stage (the ``KEY=VALUE`` form this project uses)."""
    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            for pair in re.findall(r'(\w+)=("[^"]*"|\S+)', instruction.arguments):
                env[pair[0]] = pair[1].strip('"')
    return env


def image_settings_env(target: str = SIDECAR_TARGET) -> dict[str, str]:
    """The ``KVSCOPE_*`` defaults the image sets, which a manifest's own env overrides."""
    env = env_of(image_instructions(DOCKERFILE, target))
    return {name: value for name, value in env.items() if name.startswith("KVSCOPE_")}


def copy_sources(dockerfile: Path) -> list[str]:
    """What the Dockerfile COPYs from the build context (not from another stage)."""
    sources: list[str] = []
    for instruction in instructions(dockerfile):
        if instruction.keyword == "COPY" and not instruction.arguments.startswith("--from"):
            sources += instruction.arguments.split()[:-1]
    return sources


# --- compose


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services_in_profile(profile: str) -> dict[str, dict[str, Any]]:
    """The services ``docker compose --profile PROFILE up`` starts."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if profile in service.get("profiles", [profile])
    }


def network_names(name: str, service: Mapping[str, Any]) -> set[str]:
    """The host names a compose service answers to: its name and its network aliases."""
    aliases = {
        alias
        for network in (service.get("networks") or {}).values()
        for alias in (network or {}).get("aliases", [])
    }
    return {name} | aliases


# --- Kubernetes


def k8s_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every object in docker/k8s/*.yaml (what ``kubectl apply -f docker/k8s/`` applies)."""
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path, document


def k8s_object(kind: str) -> dict[str, Any]:
    """The one object of ``kind``."""
    found = [document for _, document in k8s_documents() if document["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in docker/k8s, found {len(found)}"
    return found[0]


def pod_containers() -> dict[str, dict[str, Any]]:
    """The Deployment's pod's containers, by name."""
    spec = k8s_object("Deployment")["spec"]["template"]["spec"]
    return {container["name"]: container for container in spec["containers"]}


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """A Kubernetes container's literal environment (valueFrom entries left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# --- how vLLM and the sidecar meet


@dataclass(frozen=True, slots=True)
class Endpoint:
    """``tcp://HOST:PORT``, split."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        match = re.fullmatch(r"tcp://(.+):(\d+)", text)
        assert match, f"{text!r} is not tcp://HOST:PORT"
        return cls(match[1], int(match[2]))

    def reached_at(self, host: str, port: int) -> bool:
        """Whether a socket bound here is reached by connecting to ``host:port``."""
        return self.port == port and self.host in ("*", "0.0.0.0", host)


@dataclass(frozen=True, slots=True)
class VllmCommand:
    """What a ``vllm serve`` command line says about where kvscope's events go."""

    extra_config: dict[str, Any]
    """kv_connector_extra_config: kvscope's spec and its publisher's endpoints."""
    kv_events: dict[str, Any]
    """--kv-events-config: vLLM's own (GPU) KV event publisher."""

    @classmethod
    def parse(cls, args: list[str]) -> VllmCommand:
        def value(flag: str) -> dict[str, Any]:
            assert flag in args, f"vllm serve has no {flag}"
            return json.loads(args[args.index(flag) + 1])

        transfer = value("--kv-transfer-config")
        assert transfer["kv_connector"] == "OffloadingConnector", transfer
        return cls(transfer["kv_connector_extra_config"], value("--kv-events-config"))


def wiring_problems(
    vllm: VllmCommand, sidecar: SidecarSettings, vllm_host: str, sidecar_host: str
) -> list[str]:
    """Where the sidecar's settings and vLLM's command line miss each other.

    ``vllm_host`` is the name the sidecar reaches vLLM by, ``sidecar_host`` the
    one vLLM reaches the sidecar by (service names in compose, 127.0.0.1 in a pod).
    """
    problems: list[str] = []

    def meets(bound: str, connect: str, host: str, what: str) -> None:
        """The socket bound at ``bound`` is what connecting to ``connect`` (at ``host``) reaches."""
        target = Endpoint.parse(connect)
        if target.host != host:
            problems.append(f"{what}: {connect} should name {host}")
        elif not Endpoint.parse(bound).reached_at(target.host, target.port):
            problems.append(f"{what}: {connect} does not reach {bound}")

    extra = vllm.extra_config
    if extra.get("spec_name") != "KVScopeOffloadingSpec" or extra.get("spec_module_path") != (
        "offload.vllm"
    ):
        problems.append(f"vLLM does not load kvscope's spec: {extra}")
    if len(sidecar.connect) != 1 or len(sidecar.replay) != 1:
        problems.append("the sidecar should connect to kvscope's publisher (and its replay) once")
    else:
        meets(extra["kvscope_endpoint"], sidecar.connect[0], vllm_host, "sidecar connect")
        meets(extra["kvscope_replay_endpoint"], sidecar.replay[0], vllm_host, "sidecar replay")
    if len(sidecar.listen) != 1:
        problems.append("the sidecar should listen once, for vLLM's GPU events")
    else:
        meets(sidecar.listen[0], vllm.kv_events["endpoint"], sidecar_host, "vLLM's KV events")
    streams = sidecar.listen_streams()
    if [stream.name for stream in streams] != ["@0"]:
        problems.append(f"the sidecar should declare vLLM's stream @0, not {streams}")
    else:
        replay = streams[0].replay_endpoint or ""
        meets(vllm.kv_events["replay_endpoint"], replay, vllm_host, "sidecar listen replay")
    return problems


def spec_accepts(extra_config: Mapping[str, Any]) -> None:
    """kvscope's vLLM spec reads this ``kv_connector_extra_config`` without complaint.

    Every key and value as the spec checks them, but the tier's size only as a
    whole number of bytes: the spec also refuses a tier larger than the host it
    runs on, the GPU machine, not this one (test_k8s checks that the pod's
    memory request holds it). Skips where vLLM (which ``offload.vllm``
    imports) is not installed.
    """
    settings = pytest.importorskip(
        "offload.vllm.settings", reason="needs vllm==0.33.0 (make test installs it)"
    )
    positive_int("cpu_bytes_to_use", extra_config["cpu_bytes_to_use"], floor=True)
    one_chunk = {**extra_config, "cpu_bytes_to_use": None, "num_cpu_blocks": 1}
    spec = settings.read_settings(
        one_chunk, worker_kv_bytes_per_block=2 * 1024 * 1024, world_size=1, blocks_per_chunk=1
    )
    assert spec.kvscope_endpoint == extra_config["kvscope_endpoint"]
