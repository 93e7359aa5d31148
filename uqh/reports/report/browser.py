"""Open an HTML report in headless Chromium with Playwright: console errors, screenshots, page checks.

Playwright (PyPI ``playwright``) drives the system's Chromium by its executable path (Debian's ``chromium``,
installed by scripts/setup.sh); no browser is ever downloaded. Used by the report tests and as a tool:

    python -m uqh.reports.report.browser REPORT.html --shot traces.png [--hash traces] [--selector '#traces']

Exit status 0 when the page loaded without console errors or uncaught exceptions, 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Headless in a container: no sandbox (root), no GPU.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]


def find_chromium() -> str | None:
    """``$UQH_CHROMIUM``, else the first Chromium on PATH; None when there is none."""
    env = os.environ.get("UQH_CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@contextlib.contextmanager
def browser(executable: str | None = None) -> Iterator:
    """A headless Playwright Chromium browser on the system's executable (closed afterwards)."""
    from playwright.sync_api import sync_playwright

    executable = executable or find_chromium()
    if executable is None:
        raise RuntimeError("no Chromium found: install Chromium (Debian: apt-get install chromium) or set UQH_CHROMIUM to its executable")
    from playwright.sync_api import Error as PlaywrightError

    with sync_playwright() as pw:
        try:
            b = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True, timeout=30_000)
        except PlaywrightError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RuntimeError(f"Chromium at {executable} did not start: {first}") from None
        try:
            yield b
        finally:
            b.close()


def watch_errors(page) -> list[str]:
    """A list that fills with the page's console errors, uncaught exceptions and failed requests."""
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))
    return errors


def open_report(b, html: Path, *, url_hash: str = "", width: int = 1280, height: int = 900):
    """(page, errors) of ``html`` opened at ``#url_hash``, after the trace explorer is drawn."""
    page = b.new_page(viewport={"width": width, "height": height})
    errors = watch_errors(page)
    page.goto(Path(html).resolve().as_uri() + (f"#{url_hash}" if url_hash else ""))
    page.wait_for_selector("body[data-trace-ready='1']", state="attached", timeout=15_000)
    return page, errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m uqh.reports.report.browser", description=__doc__.splitlines()[0])
    p.add_argument("html", type=Path)
    p.add_argument("--shot", type=Path, help="write a PNG screenshot here")
    p.add_argument("--hash", default="", help="URL fragment, e.g. traces or trace=0/ID")
    p.add_argument("--selector", help="screenshot only this element")
    args = p.parse_args(argv)
    if not args.html.is_file():
        print(f"browser: {args.html} is not a file", file=sys.stderr)
        return 2
    with browser() as b:
        page, errors = open_report(b, args.html, url_hash=args.hash)
        if args.shot:
            target = page.locator(args.selector) if args.selector else page
            target.screenshot(path=str(args.shot))
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
