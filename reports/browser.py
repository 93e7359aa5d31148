"""Open an HTML file in headless Chromium, collect console errors, evaluate checks, take a screenshot.

Drives Chromium through the DevTools protocol with aiohttp's websocket client (no npm, no playwright):

    python -m reports.browser REPORT.html --shot trace.png [--hash 'trace=0/ID'] [--selector '#traces']

Exit status 0 when the page loaded without console errors or uncaught exceptions, 1 otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--mute-audio",
]


def find_chromium() -> str | None:
    env = os.environ.get("UQH_CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed loads
    values: dict[str, Any] = field(default_factory=dict)  # results of the evaluated expressions
    screenshot: Path | None = None


class _CDP:
    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []
        self.waiters: list[tuple[str, asyncio.Future]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        import aiohttp

        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)
                for name, fut in list(self.waiters):
                    if name == data["method"] and not fut.done():
                        fut.set_result(data)

    async def call(self, method: str, **params) -> dict:
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        data = await asyncio.wait_for(fut, 30)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return data.get("result", {})

    def expect(self, method: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((method, fut))
        return fut

    async def evaluate(self, expression: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"evaluate {expression!r}: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the Chromium we started and its helper processes (its own process group), then reap it."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.wait()
    time.sleep(0.2)  # helpers of the group exit right after the browser


def _event_errors(events: list[dict]) -> list[str]:
    out = []
    for ev in events:
        m, p = ev["method"], ev.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("uncaught: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
    return out


async def _open_page(
    url: str,
    *,
    chromium: str,
    screenshot: Path | None,
    selector: str | None,
    ready_expression: str,
    checks: dict[str, str],
    width: int,
    height: int,
    timeout_s: float,
) -> PageResult:
    import aiohttp

    # Chromium's helper processes may still touch the profile while exiting: cleanup errors are not failures.
    with tempfile.TemporaryDirectory(prefix="uqh-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: stopping it stops its helpers too
        )
        try:
            port = None
            deadline = time.monotonic() + timeout_s
            assert proc.stderr is not None
            while time.monotonic() < deadline:
                try:
                    line = await asyncio.wait_for(asyncio.to_thread(proc.stderr.readline),
                                                  max(0.1, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    break
                if not line:
                    break
                m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
                if m:
                    port = int(m.group(1))
                    break
            if port is None:
                raise RuntimeError(f"chromium did not start a DevTools endpoint (exit code {proc.poll()})")
            # keep draining stderr so chromium never blocks on a full pipe
            drain = asyncio.create_task(asyncio.to_thread(proc.stderr.read))
            async with aiohttp.ClientSession() as http:
                page_ws = None
                while time.monotonic() < deadline and page_ws is None:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                        for target in await r.json():
                            if target.get("type") == "page":
                                page_ws = target["webSocketDebuggerUrl"]
                    if page_ws is None:
                        await asyncio.sleep(0.1)
                if page_ws is None:
                    raise RuntimeError("chromium opened no page target")
                async with http.ws_connect(page_ws, max_msg_size=0) as ws:
                    cdp = _CDP(ws)
                    for domain in ("Runtime", "Log", "Page"):
                        await cdp.call(f"{domain}.enable")
                    await cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                                   deviceScaleFactor=1, mobile=False)
                    loaded = cdp.expect("Page.loadEventFired")
                    nav = await cdp.call("Page.navigate", url=url)
                    if nav.get("errorText"):
                        raise RuntimeError(f"cannot open {url}: {nav['errorText']}")
                    await asyncio.wait_for(loaded, timeout_s)
                    # The load event may be about:blank's; wait until OUR document is the one answering, ready.
                    page_url = url.split("#", 1)[0]
                    ready_js = f"location.href.split('#')[0] === {json.dumps(page_url)} && ({ready_expression})"
                    ready = False
                    while time.monotonic() < deadline:
                        try:
                            ready = bool(await cdp.evaluate(ready_js))
                        except RuntimeError:  # the execution context was replaced mid-navigation
                            ready = False
                        if ready:
                            break
                        await asyncio.sleep(0.05)
                    result = PageResult()
                    result.values["ready"] = ready
                    for name, expr in checks.items():
                        result.values[name] = await cdp.evaluate(expr)
                    if screenshot is not None:
                        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
                        if selector:
                            rect = await cdp.evaluate(
                                f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                                " e.scrollIntoView(); const r = e.getBoundingClientRect();"
                                " return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height}; })()"
                            )
                            if rect is None:
                                raise RuntimeError(f"no element matches {selector!r}")
                            params["clip"] = {"x": rect["x"], "y": rect["y"], "width": max(rect["w"], 1),
                                              "height": max(rect["h"], 1), "scale": 1}
                        shot = await cdp.call("Page.captureScreenshot", **params)
                        screenshot.parent.mkdir(parents=True, exist_ok=True)
                        screenshot.write_bytes(base64.b64decode(shot["data"]))
                        result.screenshot = screenshot
                    await asyncio.sleep(0.1)  # let late console events arrive
                    result.errors = _event_errors(cdp.events)
                    cdp.reader.cancel()
            drain.cancel()
            return result
        finally:
            _stop_group(proc)


def open_page(
    html_path: Path,
    *,
    screenshot: Path | None = None,
    url_hash: str = "",
    selector: str | None = None,
    ready_expression: str = "document.readyState === 'complete' && document.body.getAttribute('data-trace-ready') === '1'",
    checks: dict[str, str] | None = None,
    width: int = 1280,
    height: int = 900,
    timeout_s: float = 60.0,
    chromium: str | None = None,
) -> PageResult:
    """Load ``html_path`` (plus ``#url_hash``) in headless Chromium; see :class:`PageResult`."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    url = Path(html_path).resolve().as_uri() + (f"#{url_hash}" if url_hash else "")
    return asyncio.run(
        _open_page(url, chromium=chromium, screenshot=screenshot, selector=selector, ready_expression=ready_expression,
                   checks=checks or {}, width=width, height=height, timeout_s=timeout_s)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reports.browser", description=__doc__.splitlines()[0])
    p.add_argument("html", type=Path)
    p.add_argument("--shot", type=Path, default=None, help="write a PNG screenshot here")
    p.add_argument("--hash", default="", help="URL fragment, e.g. 'trace=0/task#0'")
    p.add_argument("--selector", default=None, help="screenshot only this element (CSS selector)")
    args = p.parse_args(argv)
    if not args.html.is_file():
        print(f"browser: error: {args.html} does not exist", file=sys.stderr)
        return 2
    res = open_page(args.html, screenshot=args.shot, url_hash=args.hash, selector=args.selector)
    for e in res.errors:
        print("error:", e)
    print(json.dumps({"errors": len(res.errors), **res.values, "screenshot": str(res.screenshot)}))
    return 0 if not res.errors and res.values.get("ready") else 1


if __name__ == "__main__":
    sys.exit(main())
