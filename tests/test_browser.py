"""tests/browser.py's own behaviour where Chromium fails: a browser that exits at its start is
started again, and one that never stays up says why (its exit and what it printed)."""

from __future__ import annotations

import pytest

from tests.browser import STARTS, Browser, BrowserGone


def test_a_browser_that_exits_at_its_start_is_tried_again_and_then_says_why(tmp_path):
    starts = tmp_path / "starts"
    fake = tmp_path / "chromium"
    fake.write_text(f"#!/bin/sh\necho started >> {starts}\necho 'no display for you' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(BrowserGone, match=r"exit 3, start 3 of 3\); it said: no display for you"):
        Browser(str(fake), tmp_path)
    assert starts.read_text().count("started") == STARTS
