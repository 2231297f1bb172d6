"""Open a page in a real headless Chromium and report what happened, over the DevTools protocol.

Returns the console errors, uncaught exceptions, every network request other than the page
itself, facts read from the rendered DOM, and optionally a full-page screenshot. Chromium is
Debian's `chromium` package (`.ci/run` installs it); it is started with no network features
and a throwaway profile.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1"]

DOM_FACTS = """JSON.stringify({
  title: document.title,
  sections: [...document.querySelectorAll('section')].map(s => s.id),
  figures: Object.fromEntries([...document.querySelectorAll('figure')].map(f => {
     const svg = f.querySelector('svg'); const r = svg ? svg.getBoundingClientRect() : null;
     return [f.id, svg ? {width: r.width, height: r.height, paths: svg.querySelectorAll('path, use').length} : null]; })),
  rows: document.querySelectorAll('#trials tr').length - 1,
  text: document.body.innerText,
})"""


class _CDP:
    def __init__(self, ws: Any) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my = self.next_id
        await self.ws.send_str(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive(timeout=60)).data)
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    async def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            msg = json.loads((await self.ws.receive(timeout=max(deadline - time.monotonic(), 0.1))).data)
            self.events.append(msg)


async def _inspect(port: int, url: str, screenshot: Path | None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as r:
            target = await r.json(content_type=None)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _CDP(ws)
            for domain in ("Runtime", "Log", "Network", "Page"):
                await cdp.call(f"{domain}.enable")
            await cdp.call("Emulation.setDeviceMetricsOverride", width=1200, height=900, deviceScaleFactor=1, mobile=False)
            await cdp.call("Page.navigate", url=url)
            await cdp.wait_for("Page.loadEventFired")
            await asyncio.sleep(0.5)  # let late console messages arrive
            facts = json.loads((await cdp.call("Runtime.evaluate", expression=DOM_FACTS, returnByValue=True))["result"]["value"])
            if screenshot is not None:
                shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
    errors, requests = [], []
    for e in cdp.events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            errors.append(p["exceptionDetails"].get("text", "exception"))
        elif m == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            errors.append(p["entry"]["text"])
        elif m == "Network.requestWillBeSent" and p["request"]["url"] != url and not p["request"]["url"].startswith("data:"):
            requests.append(p["request"]["url"])
    return {"errors": errors, "requests": requests, **facts}


def inspect_page(path: Path, screenshot: Path | None = None) -> dict[str, Any]:
    """Load `path` (file://) in headless Chromium; see the module docstring for what comes back."""
    # Chromium's helper processes may still write into the profile for a moment after the browser
    # exits: the whole group is stopped, and a leftover file does not fail the check.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            port = None
            deadline = time.monotonic() + 60
            while port is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {proc.returncode}")
                m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                port = int(m.group(1)) if m else None
            if port is None:
                raise RuntimeError("chromium did not open its DevTools port within 60 s")
            return asyncio.run(_inspect(port, path.resolve().as_uri(), screenshot))
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """TERM, then KILL, to the browser's whole process group (renderers and zygotes included)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
