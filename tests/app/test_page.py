"""The web page's files as the sidecar serves them: a fixed list, a complete module graph with
no build step, uPlot vendored (or a clear failure without it), within the size budget."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path, PurePosixPath

import pytest
from fastapi import FastAPI

from app.api.guards.security_headers import CONTENT_SECURITY_POLICY
from app.api.page import STATIC_DIR, VENDORED, mount_page, page_assets
from app.settings import SidecarSettings
from tests.support.http_app import AUTH, LISTEN, TOKEN, in_process, sidecar_app

JS_BUDGET_BYTES = 200 * 1024
"""The issue's budget for the JavaScript the page ships, uPlot included."""
IMPORT = re.compile(r"""^\s*(?:import|export)\s[^"']*?\bfrom\s+["']([^"']+)["']""", re.M)
REFERENCE = re.compile(r"""(?:src|href)="([^"#]+)\"""")
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


def vendored_or_fail() -> None:
    """The vendored files are made by the set-up, not kept in git: say how to make them."""
    missing = [name for name in VENDORED if not (STATIC_DIR / name).is_file()]
    if missing:
        pytest.fail(f"{missing} absent from {STATIC_DIR}: run `make vendor` (make test does)")


def served_path(reference: str, importer: str) -> str:
    """The asset name under /static that a reference from ``importer`` (an asset name, or ""
    for index.html at "/") resolves to."""
    if not importer:
        assert reference.startswith("static/"), reference
        return reference.removeprefix("static/")
    parts: list[str] = []
    for part in (PurePosixPath(importer).parent / reference).parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def test_every_file_the_page_references_or_imports_is_served() -> None:
    """No build tool: index.html names its files, and each ES module imports the others by
    relative path; every one of those must be an asset the sidecar answers with its type."""
    vendored_or_fail()
    app, _ = sidecar_app()
    assets = page_assets(STATIC_DIR)
    index = (STATIC_DIR / "index.html").read_text()
    pending = [
        (served_path(ref, ""), "index.html") for ref in REFERENCE.findall(index) if "/" in ref
    ]
    reached: set[str] = set()
    with in_process(app) as http:
        while pending:
            name, referrer = pending.pop()
            if name in reached:
                continue
            reached.add(name)
            assert name in assets, f"{referrer} refers to {name}, which the sidecar does not serve"
            answer = http.get(f"/static/{name}")
            assert answer.status_code == 200, name
            if name.endswith(".js"):
                assert answer.headers["content-type"].startswith("text/javascript"), name
                pending += [(served_path(ref, name), name) for ref in IMPORT.findall(answer.text)]
    own = {name for name in assets if name.endswith(".js") and not name.startswith("vendor/")}
    assert own <= reached, f"modules nothing imports: {sorted(own - reached)}"
    assert {"app.js", "js/views/overview.js", "vendor/uPlot.iife.min.js"} <= reached


def test_nothing_outside_the_fixed_list_is_served() -> None:
    vendored_or_fail()
    app, _ = sidecar_app()
    with in_process(app) as http:
        for name in (
            "index.html",
            "vendor/.vendored",
            "js/nope.js",
            "../api/page.py",
            "js/../../api/page.py",
            "%2e%2e/api/page.py",
            "vendor",
        ):
            assert http.get(f"/static/{name}").status_code == 404, name
        license_text = http.get("/static/vendor/LICENSE")
        assert license_text.status_code == 200 and "MIT" in license_text.text
        assert license_text.headers["content-type"].startswith("text/plain")
        assert http.get("/static/app.js").headers["cache-control"] == "no-cache"


def test_the_shipped_javascript_is_within_its_budget() -> None:
    """The issue's 200 KB for the JavaScript shipped: a size, measured on the served files."""
    vendored_or_fail()
    scripts = [name for name in page_assets(STATIC_DIR) if name.endswith(".js")]
    total = sum((STATIC_DIR / name).stat().st_size for name in scripts)
    assert total < JS_BUDGET_BYTES, f"{total:,} bytes of JavaScript in {sorted(scripts)}"


def test_without_the_vendored_files_start_up_and_the_page_name_them_and_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkout where `make vendor` never ran: an error at start-up and a 500 from "/" that
    names the missing files and the command, never a page that fails in the browser."""
    static = tmp_path / "static"
    shutil.copytree(STATIC_DIR, static, ignore=shutil.ignore_patterns("vendor"))
    app = FastAPI()
    app.state.settings = SidecarSettings(listen=[LISTEN])
    with caplog.at_level(logging.ERROR, logger="app.api.page"):
        mount_page(app, static)
    logged = caplog.text
    with in_process(app) as http:
        answer = http.get("/")
        assert http.get("/static/vendor/uPlot.iife.min.js").status_code == 404
        assert http.get("/static/app.js").status_code == 200
    assert answer.status_code == 500
    for text in (logged, answer.text):
        assert str(static / "vendor/uPlot.iife.min.js") in text
        assert "make vendor" in text and "npm ci --ignore-scripts" in text


def test_the_favicon_is_open_while_the_page_needs_the_token() -> None:
    """Browsers fetch /favicon.ico without the cookie, on the 401 page too: it must answer."""
    app, _ = sidecar_app(token=TOKEN)
    with in_process(app) as http:
        icon = http.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.content.startswith(b"<svg")
        assert http.get("/").status_code == 401
        assert http.get("/", headers=AUTH).status_code == 200


def test_a_reload_revalidates_each_file_and_gets_it_only_when_it_changed() -> None:
    app, _ = sidecar_app(token=TOKEN)
    with in_process(app) as http:
        for path in ("/", "/static/app.js", "/static/vendor/uPlot.iife.min.js"):
            first = http.get(path, headers=AUTH)
            assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
            tag = first.headers["etag"]
            again = http.get(path, headers={**AUTH, "If-None-Match": tag})
            assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", tag)
            stale = http.get(path, headers={**AUTH, "If-None-Match": '"an-older-one"'})
            assert stale.status_code == 200 and stale.content == first.content


def test_the_page_loads_nothing_from_elsewhere_and_needs_no_eval() -> None:
    """Everything is 'self': no CDN in the policy or in the page's own files."""
    directives = dict(part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY and "http" not in CONTENT_SECURITY_POLICY
    own = [n for n in page_assets(STATIC_DIR) if not n.startswith("vendor/")] + ["index.html"]
    for name in own:
        text = (STATIC_DIR / name).read_text().replace(SVG_NAMESPACE, "")
        assert "http://" not in text and "https://" not in text, name
        assert "innerHTML" not in text and "eval(" not in text, name
