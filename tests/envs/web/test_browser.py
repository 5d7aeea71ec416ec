"""Browser mode: headless Debian Chromium screenshots of the page the agent is on."""

import os
import struct

import numpy as np
import pytest
from matplotlib import image

from envhub.envs.web import browser
from envhub.envs.web.env import WebShopEnv


@pytest.fixture
def chromium():
    path = browser.find_chromium()
    if path is None:
        if os.environ.get("ENVHUB_REQUIRE_BROWSER") or os.environ.get("CI"):
            pytest.fail(
                "Chromium is not installed but this run requires it: apt-get install -y chromium (make install does)"
            )
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    return path


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
async def test_screenshot_shows_the_current_page(chromium, tmp_path):
    env = WebShopEnv(render="screenshot", screenshot_dir=str(tmp_path))
    try:
        _, info = await env.areset(seed=4)
        home = info["screenshot"]
        _, _, _, _, info = await env.astep(f"search[{env.goal.product_type}]")
        results = info["screenshot"]
    finally:
        await env.aclose()
    assert home != results
    for path in (home, results):
        assert png_size(path) == (1024, 768)
        pixels = image.imread(path)[..., :3]
        assert pixels.shape == (768, 1024, 3) and pixels.std() > 0.05  # not blank
        # The shop's dark header bar and the pale yellow instruction strip are drawn where the page puts them.
        assert np.allclose(pixels[8, 900], [0x23 / 255, 0x2F / 255, 0x3E / 255], atol=0.03)
        assert np.allclose(pixels[75, 900], [0xFF / 255, 0xF8 / 255, 0xE1 / 255], atol=0.03)
    # A results page has far more dark text (ten products) than the home page.
    dark = lambda path: (image.imread(path)[120:, :, :3].mean(axis=2) < 0.5).mean()
    assert dark(results) > 2 * dark(home)


def test_missing_chromium_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(browser, "CHROMIUM_CANDIDATES", ("/nonexistent/chromium",))
    monkeypatch.delenv("ENVHUB_CHROMIUM", raising=False)
    with pytest.raises(Exception, match="apt-get install -y chromium"):
        WebShopEnv(render="screenshot")
