"""The image's HEALTHCHECK: GET /healthz on the sidecar's own port, exit 0 when it answers 200.

A script rather than curl, because the slim image carries no curl and the
sidecar's Python is already there; it reads the same ``KVSCOPE_HOST`` and
``KVSCOPE_PORT`` the sidecar binds, so a port changed by environment is
still the port checked.
"""

import os
import sys
import urllib.request

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def main() -> int:
    host = os.environ.get("KVSCOPE_HOST", "127.0.0.1")
    host = "127.0.0.1" if host in WILDCARDS else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{host}:{os.environ.get('KVSCOPE_PORT', '8000')}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
