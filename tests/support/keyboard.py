"""Reaching a page's control as a keyboard user does."""

from __future__ import annotations

import pytest
from playwright import sync_api


def tab_to(
    page: sync_api.Page, start: str, target: sync_api.Locator, presses: int, what: str
) -> None:
    """Focus ``start`` (a selector), press Tab until ``target`` has the focus, at most
    ``presses`` times, and check it shows a focus ring: a control only a mouse reaches, or
    one focused unseen, fails naming ``what``."""
    page.focus(start)
    for _ in range(presses):
        page.keyboard.press("Tab")
        if target.evaluate("element => element === document.activeElement"):
            break
    else:
        pytest.fail(f"Tab never reached {what}")
    outline = target.evaluate("element => getComputedStyle(element).outlineStyle")
    assert outline != "none", f"{what} shows no focus ring"
