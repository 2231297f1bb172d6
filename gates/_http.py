"""Minimal blocking HTTP client for the gates (stdlib only, so the gate has no moving deps)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["GateHTTPError", "get_json", "post_json", "post_stream"]


class GateHTTPError(RuntimeError):
    """The server answered with an error status or unparseable body."""


def _url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def get_json(base_url: str, path: str, *, timeout: float = 30.0) -> Any:
    """GET ``path`` and parse JSON."""
    try:
        with urllib.request.urlopen(_url(base_url, path), timeout=timeout) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, ValueError) as exc:
        raise GateHTTPError(f"GET {path}: {exc}") from exc


def post_json(base_url: str, path: str, body: dict[str, Any], *, timeout: float = 120.0) -> tuple[Any, float]:
    """POST a JSON body; return (parsed reply, wall seconds)."""
    req = urllib.request.Request(_url(base_url, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise GateHTTPError(f"POST {path}: HTTP {exc.code}: {detail}") from exc
    except urllib.error.URLError as exc:
        raise GateHTTPError(f"POST {path}: {exc}") from exc
    elapsed = time.perf_counter() - start
    try:
        return json.loads(raw), elapsed
    except ValueError as exc:
        raise GateHTTPError(f"POST {path}: reply is not JSON") from exc


def post_stream(base_url: str, path: str, body: dict[str, Any], *, timeout: float = 120.0) -> list[dict[str, Any]]:
    """POST with ``stream: true`` and return every SSE ``data:`` event (``[DONE]`` dropped)."""
    req = urllib.request.Request(_url(base_url, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                                 method="POST")
    events: list[dict[str, Any]] = []
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                events.append(json.loads(data))
    except urllib.error.HTTPError as exc:
        raise GateHTTPError(f"POST {path} (stream): HTTP {exc.code}") from exc
    except (urllib.error.URLError, ValueError) as exc:
        raise GateHTTPError(f"POST {path} (stream): {exc}") from exc
    return events
