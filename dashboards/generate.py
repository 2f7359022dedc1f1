"""Write kvscope's dashboards as Grafana JSON beside this file (or check them with --check).

Run ``.venv/bin/python dashboards/generate.py`` after changing a dashboard's
Python, and commit the JSON it writes: Grafana provisioning reads the JSON.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the repository root is not on the path
    sys.path.insert(0, str(HERE.parent))

from dashboards import kit, overview, transfers  # noqa: E402

DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "kvscope-overview.json": overview.build,
    "kvscope-transfers.json": transfers.build,
}


def render_all() -> dict[str, str]:
    """Every dashboard's file name and JSON text, as committed."""
    return {name: kit.render(build()) for name, build in DASHBOARDS.items()}


def stale(directory: Path = HERE) -> list[str]:
    """Files in ``directory`` that differ from what the code generates (or are missing)."""
    return [
        name
        for name, text in render_all().items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for name in out_of_date:
            print(f"{name} is out of date: run {Path(__file__).name}", file=sys.stderr)
        return 1 if out_of_date else 0
    for name, text in render_all().items():
        (HERE / name).write_text(text)
        print(f"wrote dashboards/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
