"""Headless Chromium for a page on disk: its DOM after the scripts ran, its console, and a screenshot.

Used by the report's browser test and by ``scripts/report_screenshot.py`` (the README's screenshot), so
both take the picture the same way. Nothing here is needed to build a report.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run")
_CONSOLE = re.compile(r":(INFO|WARNING|ERROR|FATAL):CONSOLE[^\]]*\]\s*(.*)")


def find_browser() -> str | None:
    """The first of chromium / chromium-browser / google-chrome on PATH, or None."""
    return next((b for b in BROWSERS if shutil.which(b)), None)


@dataclass
class PageRun:
    """What headless Chromium made of a page."""

    dom: str
    """the serialised DOM after the page's scripts ran (``--dump-dom``)"""
    console: list[str]
    """the page's console messages (``console.*`` and uncaught errors), one per line"""

    @property
    def errors(self) -> list[str]:
        """Uncaught exceptions. (Chromium logs every console level alike, so ``console.error`` is only told
        apart from ``console.log`` by its text: a page meant to be silent should have no console at all.)"""
        return [line for line in self.console if "Uncaught" in line]


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError(f"no headless browser on PATH (looked for {', '.join(BROWSERS)})")
    with tempfile.TemporaryDirectory(prefix="verl-chromium-") as profile:
        return subprocess.run(
            [browser, *_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def load_page(page: Path, fragment: str = "", timeout: float = 90) -> PageRun:
    """Open ``page`` (plus ``#fragment``), let its scripts run, and return its DOM and console."""
    url = Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    done = _run(["--enable-logging=stderr", "--v=0", "--dump-dom", url], timeout)
    console = [m.group(2) for m in map(_CONSOLE.search, done.stderr.splitlines()) if m]
    return PageRun(done.stdout, console)


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 1500, timeout: float = 90) -> Path:
    """A ``width`` x ``height`` pixel PNG of the top of ``page``."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    done = _run(
        [f"--screenshot={png}", f"--window-size={width},{height}", Path(page).resolve().as_uri()], timeout
    )
    if not png.is_file():
        raise RuntimeError(f"the browser wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}")
    return png


def screenshot_report(
    run_dir: str | Path,
    png: str | Path,
    output: str | Path | None = None,
    width: int = 1200,
    height: int = 1500,
) -> Path:
    """Build the report of ``run_dir`` (to ``output``, default ``RUN_DIR/report.html``) and take a
    ``width`` x ``height`` screenshot of its top: the picture in docs/report.md, and the browser test's."""
    from verl.report.page import build_report

    return screenshot(build_report(run_dir, output), Path(png), width=width, height=height)
