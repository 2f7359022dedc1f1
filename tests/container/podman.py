"""Building and running images here, with Debian's podman, where no Docker engine or registry is.

Podman builds and runs images as root once told (``CONTAINERS_CONF``) to use
cgroupfs rather than systemd, to set no default ulimits, and to run containers
with runc. With no registry to pull the Dockerfile's default base
(python:3.11-slim) from, the base is made from Debian packages by mmdebstrap
and imported; it is cached under ~/.cache/kvscope, keyed on its inputs, so
only the first run on a machine pays for it (about a minute).

Why a run cannot happen (not root, a package missing, podman refusing to
start) is a skip reason, worded here so every test says the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

CONTAINERS_CONF: Final = """\
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""
"""No systemd to manage cgroups here, and no ulimits the host would refuse to raise."""

CA_BUNDLE: Final = Path("/etc/ssl/certs/ca-certificates.crt")
"""The host's CA bundle (Debian's ca-certificates), mounted over the build's own:
the host may reach PyPI through a proxy whose CA only this bundle holds."""

BASE_SUITE: Final = "bookworm"
BASE_PACKAGES: Final = ("python3", "python3-venv", "ca-certificates", "netbase")
"""What python:3.11-slim gives the Dockerfile: python3 (bookworm's is 3.11) and,
through python3-venv, the pip wheel that the image's venv installs with."""
BASE_OPTIONS: Final = (
    "--variant=minbase",
    '--aptopt=Acquire::Languages "none"',
    *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
)
"""minbase: Essential packages and apt, as a slim image has; no documentation."""

CACHE_DIR: Final = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvscope"

BUILD_TIMEOUT_S: Final = 600


class PodmanError(RuntimeError):
    """A podman command failed; the message carries its command line and the end of its output."""


class NoBaseImage(RuntimeError):
    """mmdebstrap could not make the Debian base: this machine's lack (a mirror, a package)."""


def unusable_reason() -> str | None:
    """Why podman cannot build and run images here, or None when it can."""
    if os.geteuid() != 0:
        return "podman runs images here as root only (tests/container/podman.py); not root"
    for command, package in (("podman", "podman"), ("runc", "runc")):
        if shutil.which(command) is None:
            return f"Debian package {package} not installed (make debs installs it)"
    return None


class Podman:
    """The podman command line, configured by a containers.conf of its own."""

    def __init__(self, conf_dir: Path) -> None:
        conf = conf_dir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGS``; with ``check``, a failure raises PodmanError with its output."""
        done = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise PodmanError(
                f"podman {' '.join(args)} exited {done.returncode}:\n"
                f"{(done.stdout + done.stderr)[-4000:]}"
            )
        return done

    def start_failure(self) -> str | None:
        """Why podman itself will not start here (its storage, its runtime), or None."""
        done = self.run("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
        if done.returncode != 0:
            return f"podman info failed: {done.stderr.strip()[-500:]}"
        return None

    def image_exists(self, tag: str) -> bool:
        return self.run("image", "exists", tag, check=False).returncode == 0

    def inspect_image(self, tag: str) -> dict[str, Any]:
        """The image's configuration (user, ports, environment, labels, healthcheck...)."""
        return json.loads(self.run("image", "inspect", tag).stdout)[0]

    def size(self, tag: str) -> int:
        return int(self.run("image", "inspect", tag, "--format", "{{.Size}}").stdout)

    def debian_base(self) -> str:
        """The Debian base image's tag, made (or imported from the cache) when missing.

        Raises NoBaseImage when mmdebstrap cannot make it (not installed, no
        mirror reachable): the machine's failure, which the caller turns into a skip.
        """
        key = hashlib.sha256(
            json.dumps([BASE_SUITE, BASE_PACKAGES, BASE_OPTIONS]).encode()
        ).hexdigest()[:16]
        tag = f"localhost/kvscope-test-base:{key}"
        if self.image_exists(tag):
            return tag
        tarball = CACHE_DIR / f"debian-base-{key}.tar"
        if not tarball.exists():
            self._mmdebstrap(tarball)
        self.run("import", "--change", 'CMD ["python3"]', str(tarball), tag)
        return tag

    def _mmdebstrap(self, tarball: Path) -> None:
        if shutil.which("mmdebstrap") is None:
            raise NoBaseImage("Debian package mmdebstrap not installed (make debs installs it)")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_name(tarball.name + ".partial")
        include = "--include=" + ",".join(BASE_PACKAGES)
        done = subprocess.run(
            ["mmdebstrap", "--quiet", "--format=tar", *BASE_OPTIONS, include, BASE_SUITE,
             str(partial)],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise NoBaseImage(f"mmdebstrap failed: {done.stderr.strip()[-1500:]}")
        partial.rename(tarball)  # whole or absent: an interrupted run leaves no cache

    def build(self, tag: str, dockerfile: Path, context: Path, build_args: dict[str, str]) -> None:
        """``podman build`` as the README's ``docker build``, with what this host needs.

        Docker's image format, not OCI's: OCI's has no HEALTHCHECK. The host's
        network and CA bundle, for pip inside the build.
        """
        args = ["build", "--format", "docker", "--network", "host", "-f", str(dockerfile)]
        if CA_BUNDLE.exists():
            args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
        for name, value in build_args.items():
            args += ["--build-arg", f"{name}={value}"]
        self.run(*args, "-t", tag, str(context), timeout=BUILD_TIMEOUT_S)

    @contextmanager
    def container(
        self, image: str, options: Sequence[str] = (), command: Sequence[str] = ()
    ) -> Iterator[str]:
        """A detached container of ``image``; yields its id, and removes it on exit."""
        container = self.run("run", "--detach", *options, image, *command).stdout.strip()
        try:
            yield container
        finally:
            self.run("rm", "--force", "--time", "5", container, check=False)
