"""Headless Chromium for the tests that look at pages as a person would (the graph viewer, feature cards, report
pages): the `browser` fixture, a screenshot, pixels of a colour, and the DOM and console after the page's scripts
ran. A test module takes the fixture as `browser = headless.browser`.

Skipped where no Chromium is installed, except under RESID_REQUIRE_BROWSER=1 (CI sets it, after installing
Debian's chromium), where a missing browser fails instead: CI must never skip these silently."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
REQUIRED = os.environ.get("RESID_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="module")
def browser() -> str:
    if BROWSER is None:
        if REQUIRED:
            pytest.fail("RESID_REQUIRE_BROWSER=1 but no chromium is installed: apt-get install chromium")
        pytest.skip("no headless Chromium installed (apt-get install chromium)")
    return BROWSER


def screenshot(browser: str, page: Path, out: Path, height: int = 1000) -> Image.Image:
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size=1400,{height}", "--virtual-time-budget=15000", f"--screenshot={out}",
                           page.as_uri()], capture_output=True, text=True, timeout=180)
    assert out.is_file(), done.stderr[-2000:]
    return Image.open(out).convert("RGB")


def pixels_of(image: Image.Image, colour: str, tolerance: int = 6) -> int:
    """How many pixels are within `tolerance` of `colour` (#rrggbb) in every channel (anti-aliased edges differ)."""
    want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(np.asarray(image, dtype=np.int16) - want) <= tolerance).all(-1).sum())


def load(browser: str, page: Path, script: str = "", wait_ms: int = 0) -> tuple[str, list[str]]:
    """The page's DOM after its scripts and `script` (injected at the end of its body) ran, and what it wrote to the
    console (Chromium logs every console message and uncaught error of the page as a CONSOLE line on stderr).
    wait_ms: virtual time the page gets first, for what its scripts do later (an image's onload)."""
    if script:
        page.write_text(page.read_text().replace("</body>", f"<script>{script}</script></body>"))
    wait = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--window-size=1400,1000", *wait, "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def dump_dom(browser: str, page: Path, script: str = "", wait_ms: int = 0) -> str:
    """The page's DOM after its scripts and `script` ran (see load); no uncaught error."""
    dom, console = load(browser, page, script, wait_ms)
    assert not any("Uncaught" in line for line in console), console
    return dom
