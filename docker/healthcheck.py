"""The image's HEALTHCHECK: GET /healthz on the sidecar's own port, exit 0 when it answers 200.

A script rather than curl, because the slim image carries no curl and the
sidecar's Python is already there. The port is the one the sidecar bound:
it writes its URL to ``KVSCOPE_URL_FILE`` (the image sets it) once it
listens, so a port given on the command line (``serve --port 9000``), or
picked by ``KVSCOPE_PORT=0``, is still the port checked. Until the file
exists, or where it cannot be written (a read-only root with no scratch
/tmp), the probe reads the same ``KVSCOPE_HOST`` and ``KVSCOPE_PORT`` the
sidecar does.
"""

import os
import sys
import urllib.request
from pathlib import Path

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def base_url() -> str:
    """The sidecar's URL from its file, else from the environment it shares with the probe."""
    url_file = os.environ.get("KVSCOPE_URL_FILE")
    if url_file:
        try:
            return Path(url_file).read_text().strip()
        except OSError:
            pass
    host = os.environ.get("KVSCOPE_HOST", "127.0.0.1")
    host = "127.0.0.1" if host in WILDCARDS else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{os.environ.get('KVSCOPE_PORT', '8000')}"


def main() -> int:
    url = f"{base_url()}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
