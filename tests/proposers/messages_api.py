"""A real HTTP server speaking the Anthropic Messages API, with scripted replies, for agent tests.

`POST /v1/messages` validates each request the way the API would (key header, version header,
model, max_tokens, roles alternating from a user turn, every tool_use answered by exactly one
tool_result with the same id in the next user turn, tool definitions well formed) and answers
the next scripted reply: an assistant message (text / tool_use blocks, stop_reason, usage with
cache fields), or an error status with headers (429/529 with retry-after, 500, 401, 404).
Replies may be callables of the request body, so a script can react to what the client sent.
Validation failures are recorded and answered with 400, so a test fails on any malformed request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["MessagesAPI", "error", "text", "tool_use", "turn"]

API_KEY = "sk-test-stub"
_ids = itertools.count(1)


def tool_use(name: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": input}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def turn(*blocks: dict[str, Any], usage: dict[str, int] | None = None, stop_reason: str | None = None) -> dict[str, Any]:
    """A scripted assistant reply."""
    stop = stop_reason or ("tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn")
    return {"content": list(blocks), "stop_reason": stop,
            "usage": usage or {"input_tokens": 1200, "output_tokens": 150, "cache_creation_input_tokens": 0,
                               "cache_read_input_tokens": 3000}}


def error(status: int, etype: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"error_status": status, "error_type": etype, "headers": headers or {}}


def _key(headers: Any) -> str | None:
    """The SDK sends the key as `x-api-key` or `Authorization: Bearer` depending on its version."""
    auth = headers.get("authorization", "")
    return headers.get("x-api-key") or (auth[7:] if auth.startswith("Bearer ") else None)


def validate(body: dict[str, Any], headers: Any, key: str) -> list[str]:
    """What is wrong with a Messages API request (empty = valid)."""
    errs = []
    if _key(headers) != key:
        errs.append("API key missing or wrong (x-api-key or Authorization: Bearer)")
    if not headers.get("anthropic-version"):
        errs.append("anthropic-version header missing")
    if not isinstance(body.get("model"), str) or not isinstance(body.get("max_tokens"), int):
        errs.append("model and max_tokens are required")
    for t in body.get("tools", []):
        if not t.get("name") or t.get("input_schema", {}).get("type") != "object":
            errs.append(f"bad tool definition {t.get('name')}")
    marks = json.dumps(body).count('"cache_control"')
    if marks > 4:
        errs.append(f"{marks} cache_control breakpoints; the API allows at most 4")
    msgs = body.get("messages") or []
    if not msgs or msgs[0]["role"] != "user":
        errs.append("messages must start with a user turn")
    for i, m in enumerate(msgs):
        if i and m["role"] == msgs[i - 1]["role"]:
            errs.append(f"message {i}: roles must alternate")
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        if m["role"] == "assistant":
            asked = [b["id"] for b in content if b.get("type") == "tool_use"]
            if asked:
                nxt = msgs[i + 1] if i + 1 < len(msgs) else None
                got = [b.get("tool_use_id") for b in (nxt["content"] if nxt and isinstance(nxt["content"], list) else [])
                       if b.get("type") == "tool_result"]
                if nxt is None:
                    errs.append(f"message {i}: tool_use ids {asked} have no tool_result turn after them")
                elif sorted(got) != sorted(asked):
                    errs.append(f"message {i + 1}: tool_result ids {got} do not match tool_use ids {asked}")
        else:
            for b in content:
                if b.get("type") == "tool_result" and not isinstance(b.get("content"), str | list):
                    errs.append(f"message {i}: tool_result content must be a string or blocks")
    return errs


class MessagesAPI:
    """Run with `with MessagesAPI(script) as api:`; point the client at `api.base_url`."""

    def __init__(self, script: list[Any], *, key: str = API_KEY) -> None:
        self.script, self.key = list(script), key
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.served = 0

    async def _messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        errs = validate(body, request.headers, self.key)
        if _key(request.headers) != self.key:
            return web.json_response({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}, status=401)
        if errs:
            self.errors.extend(errs)
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": "; ".join(errs)}}, status=400)
        if not self.script:
            self.errors.append("the client asked for more turns than the script has")
            return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": "script exhausted"}}, status=400)
        reply = self.script.pop(0)
        if isinstance(reply, Callable):
            reply = reply(body)
        if "error_status" in reply:
            return web.json_response({"type": "error", "error": {"type": reply["error_type"], "message": reply["error_type"]}},
                                     status=reply["error_status"], headers=reply["headers"])
        self.served += 1
        return web.json_response({"id": f"msg_{self.served:04d}", "type": "message", "role": "assistant",
                                  "model": body["model"], "content": reply["content"], "stop_reason": reply["stop_reason"],
                                  "stop_sequence": None, "usage": reply["usage"]})

    def __enter__(self) -> MessagesAPI:
        ready = threading.Event()

        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/v1/messages", self._messages)
            self.runner = web.AppRunner(app, access_log=None)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
