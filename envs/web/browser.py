"""Screenshots of shop pages with Debian's headless Chromium (`/usr/bin/chromium`), run as a subprocess."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path

from envhub.errors import ConfigError

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "chromium", "chromium-browser")
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
)


def find_chromium() -> str | None:
    """The path of a Chromium executable, or None when none is installed."""
    override = os.environ.get("ENVHUB_CHROMIUM")
    for candidate in ((override,) if override else ()) + CHROMIUM_CANDIDATES:
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.access(path, os.X_OK):
            return path
    return None


def require_chromium() -> str:
    """The Chromium executable, or a ConfigError saying how to install it."""
    path = find_chromium()
    if path is None:
        raise ConfigError(
            "render='screenshot' needs Chromium, which is not installed",
            hint="apt-get install -y chromium (Debian), or set ENVHUB_CHROMIUM to a Chromium executable",
        )
    return path


async def screenshot(
    url: str, path: str | Path, *, width: int = 1024, height: int = 768, timeout: float = 60.0
) -> Path:
    """Load `url` in headless Chromium and save a `width`x`height` PNG at `path`."""
    chromium = require_chromium()
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="envhub-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            chromium,
            *_FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={path}",
            f"--window-size={width},{height}",
            url,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except (TimeoutError, asyncio.CancelledError):
            try:  # chromium forks helpers; end its whole process group
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await process.wait()
            raise
    if process.returncode != 0 or not path.exists():
        tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"chromium could not screenshot {url} (exit {process.returncode}): {' | '.join(tail)}")
    return path
