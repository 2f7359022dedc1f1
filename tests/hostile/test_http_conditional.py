"""If-None-Match on the page's files, as RFC 9110 (13.1.2) reads it, on real uvicorn on loopback.

The tag was looked for as a substring of the field: ``*`` got the whole file,
and a field that merely contained the tag (inside another tag, or before junk)
a 304. Now the field is a list of entity tags compared weakly, or ``*``; a field
that is no such list is read as absent, so the answer is the whole file.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.http_app import AUTH, TOKEN, serving, sidecar_app

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
ASSET = "/static/app.js"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    app, _ = sidecar_app(token=TOKEN)
    with serving(app) as url, httpx.Client(base_url=url, headers=AUTH) as client:
        yield client


@pytest.fixture(scope="module")
def tag(http: httpx.Client) -> str:
    return http.get(ASSET).headers["etag"]


def fields(fields: list[str]) -> list[tuple[str, str]]:
    return [("If-None-Match", field) for field in fields]


@pytest.mark.parametrize(
    "given",
    [
        ["*"],
        ["{tag}"],
        ["W/{tag}"],
        ['"older", {tag}'],
        ['"older",W/{tag} ,'],
        [', , "a,b", {tag}'],
        ['"older"', "{tag}"],
        [", ".join(f'"{n:032x}"' for n in range(1500)) + ", W/{tag}"],
    ],
    ids=["star", "tag", "weak", "listed", "weak listed", "commas", "two fields", "1500"],
)
def test_a_matching_field_is_a_304_with_the_tag(
    http: httpx.Client, tag: str, given: list[str]
) -> None:
    answer = http.get(ASSET, headers=fields([field.replace("{tag}", tag) for field in given]))
    assert (answer.status_code, answer.content, answer.headers["etag"]) == (304, b"", tag)


@pytest.mark.parametrize(
    "given",
    [
        ['"older"'],
        ["{tag}junk"],
        ["junk{tag}"],
        ['"x,{tag}'],
        ['"x{tag}x"'],
        ["{tag_open}"],
        ['"unterminated, {tag}'],
        ["{tag} {tag}"],
        ["w/{tag}"],
        ["*, {tag}"],
        ["*", "{tag}"],
        ['"' * 30_000 + "{tag}"],
        ['"x"' + " " * 30_000 + "x, {tag}"],
        [", ".join(f'"{n:032x}"' for n in range(1500))],
    ],
    ids=[
        "other tag",
        "junk after",
        "junk before",
        "comma inside quotes",
        "inside another tag",
        "unterminated",
        "unterminated before",
        "no comma",
        "lower-case weak",
        "star in a list",
        "star and a tag",
        "quotes",
        "spaces",
        "1500 others",
    ],
)
def test_a_field_that_matches_nothing_gets_the_whole_file(
    http: httpx.Client, tag: str, given: list[str]
) -> None:
    values = [field.replace("{tag_open}", tag[:-1]).replace("{tag}", tag) for field in given]
    answer = http.get(ASSET, headers=fields(values))
    assert answer.status_code == 200 and answer.content == http.get(ASSET).content
    assert answer.headers["etag"] == tag
