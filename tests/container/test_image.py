"""The sidecar image, really built and run: docker/Dockerfile's promises, seen from outside.

podman builds the Dockerfile's plain target (the sidecar) on a Debian base
made by mmdebstrap (no registry serves python:3.11-slim here; see
tests/container/podman.py), then runs it as docker/k8s runs it: a read-only
root, no capabilities, no privilege escalation, configured only by KVSCOPE_*
variables. On the host network, on a port it picks (its URL file says which),
it follows a real publisher (the tests' ZMQ peer) and must answer /healthz,
turn ready on /readyz once that publisher is seen, expose its frames on
/metrics, pass its own HEALTHCHECK (which finds that port in the same file),
run as the Dockerfile's user, carry no torch, and exit cleanly on its
STOPSIGNAL.

The first run on a machine makes the base (about a minute) and the image
(under a minute, pip downloading from PyPI); later runs reuse both (the base
cached under ~/.cache/kvscope, the build's layers in podman's store).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from offload.base import OffloadingEvent
from tests.container.manifests import (
    DOCKERFILE,
    ROOT,
    SIDECAR_TARGET,
    image_instructions,
    image_settings_env,
    image_user,
    in_effect,
    version,
)
from tests.container.podman import NoBaseImage, Podman, unusable_reason
from tests.support.polling import wait_for
from tests.support.zmq_peers import RawPublisher, kv_payload

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

IMAGE = "localhost/kvscope-sidecar:test"
WAIT_S = 60.0
INSIDE = """
import importlib.metadata, importlib.util, json, os
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "torch": importlib.util.find_spec("torch") is not None,
    "numpy": importlib.util.find_spec("numpy") is not None,
    "kvscope": importlib.metadata.version("kvscope"),
}))
"""
"""Run by the image's own python: who it runs as, and what is installed."""


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    reason = unusable_reason()
    if reason is not None:
        pytest.skip(reason)
    podman = Podman(tmp_path_factory.mktemp("podman"))
    failure = podman.start_failure()
    if failure is not None:
        pytest.skip(failure)
    return podman


@pytest.fixture(scope="module")
def image(podman: Podman) -> str:
    """The sidecar image, built now (podman's layer cache makes an unchanged rebuild quick)."""
    try:
        base = podman.debian_base()
    except NoBaseImage as exc:
        pytest.skip(f"no Debian base image to build on: {exc}")
    previous = podman.inspect_image(IMAGE)["Id"] if podman.image_exists(IMAGE) else None
    podman.build(IMAGE, DOCKERFILE, ROOT, {"BASE_IMAGE": base})
    if previous is not None and previous != podman.inspect_image(IMAGE)["Id"]:
        podman.run("rmi", previous, check=False)  # the image this build replaced, untagged now
    return IMAGE


def test_image_runs_as_its_non_root_user_and_carries_no_torch(podman: Podman, image: str) -> None:
    inside = json.loads(
        podman.run("run", "--rm", "--entrypoint", "python3", image, "-c", INSIDE).stdout
    )
    assert (inside["uid"], inside["gid"]) == image_user() != (0, 0)
    assert inside["torch"] is False, "torch is in the sidecar image"
    assert inside["numpy"] is False, "numpy (the worker extra) is in the sidecar image"
    assert inside["kvscope"] == version()


def test_image_configuration_is_what_the_dockerfile_declares(podman: Podman, image: str) -> None:
    declared = image_instructions(DOCKERFILE, SIDECAR_TARGET)
    inspected = podman.inspect_image(image)
    config = inspected["Config"]
    assert config["User"] == in_effect(declared, "USER").arguments
    assert config["Entrypoint"] == in_effect(declared, "ENTRYPOINT").exec_form()
    assert config["Cmd"] == in_effect(declared, "CMD").exec_form()
    assert set(config["ExposedPorts"]) == {f"{in_effect(declared, 'EXPOSE').arguments}/tcp"}
    assert config["StopSignal"] == in_effect(declared, "STOPSIGNAL").arguments
    healthcheck = in_effect(declared, "HEALTHCHECK").arguments.split(" CMD ", 1)[1]
    assert inspected["Healthcheck"]["Test"] == ["CMD", *json.loads(healthcheck)]
    assert config["Labels"]["org.opencontainers.image.version"] == version()
    assert {f"{name}={value}" for name, value in image_settings_env().items()} <= set(config["Env"])


def test_image_refuses_a_bad_setting_naming_it(podman: Podman, image: str) -> None:
    done = podman.run("run", "--rm", "-e", "KVSCOPE_PORT=eighty", image, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "KVSCOPE_PORT" in done.stderr


@dataclass
class RunningSidecar:
    container: str
    publisher: RawPublisher
    http: httpx.Client
    sent: int = 0

    def publish(self) -> None:
        """One more batch of one stored block, with the next sequence number."""
        event = OffloadingEvent([self.sent], 16, "CPU", False)
        self.publisher.send(self.sent, kv_payload(event))
        self.sent += 1

    def get(self, path: str) -> httpx.Response | None:
        """The response, or None while nothing listens yet."""
        try:
            return self.http.get(path)
        except httpx.TransportError:
            return None


@pytest.fixture
def sidecar(podman: Podman, image: str) -> Iterator[RunningSidecar]:
    """The image run as docker/k8s runs it, following a publisher on this host.

    On the host network, on a port of its own choosing (``KVSCOPE_PORT=0``), read from
    the file it writes once listening (the image's ``KVSCOPE_URL_FILE``, the healthcheck's
    too): a port probed free here and handed to the container could be taken by another
    process while the container started.
    """
    publisher = RawPublisher()
    endpoints = publisher.endpoints
    options = [
        "--network", "host", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "-e", "KVSCOPE_PORT=0",
        "-e", f"KVSCOPE_CONNECT={endpoints.endpoint}",
        "-e", f"KVSCOPE_REPLAY={endpoints.replay_endpoint}",
    ]  # fmt: skip
    try:
        with podman.container(image, options) as container:
            url = wait_for(
                lambda: served_url(podman, container), bool, "the sidecar writes its URL", WAIT_S
            )
            with httpx.Client(base_url=url, timeout=10) as http:
                yield RunningSidecar(container, publisher, http)
    finally:
        publisher.close()


def served_url(podman: Podman, container: str) -> str:
    """The base URL in the container's URL file; empty until the sidecar has written it."""
    url_file = image_settings_env()["KVSCOPE_URL_FILE"]
    done = podman.run("exec", container, "cat", url_file, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def test_image_serves_probes_and_metrics_and_stops_cleanly(
    podman: Podman, sidecar: RunningSidecar
) -> None:
    def status(path: str) -> int | None:
        response = sidecar.get(path)
        return None if response is None else response.status_code

    wait_for(lambda: status("/healthz"), lambda code: code == 200, "/healthz answers", WAIT_S)
    assert status("/readyz") == 503, "ready before its publisher was seen"

    def ready() -> int | None:
        sidecar.publish()  # again each time: a batch sent before the subscription is lost
        return status("/readyz")

    wait_for(ready, lambda code: code == 200, "/readyz once the publisher is seen", WAIT_S)
    metrics = sidecar.http.get("/metrics").text
    frames = {
        sample.labels.get("publisher"): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "kvscope_sidecar_frames_total"
    }
    assert frames.get(sidecar.publisher.endpoints.endpoint, 0) >= 1, frames

    assert podman.run("healthcheck", "run", sidecar.container, check=False).returncode == 0
    uid = podman.run("exec", sidecar.container, "id", "-u").stdout.strip()
    assert int(uid) == image_user()[0]
    podman.run("stop", "--time", "20", sidecar.container)
    state = podman.run("inspect", "--format", "{{.State.ExitCode}}", sidecar.container)
    assert state.stdout.strip() == "0", podman.run("logs", sidecar.container).stderr[-2000:]
