"""A cheating (or merely interposed) proxy in front of a real hfserve, for the integrity tests.

``python tests/gates/cheats.py --upstream URL --port P --mode MODE --tokenizer DIR``

Modes, each a way a candidate could game the bench:

* ``passthrough``       - forwards everything (an extra process answering the port).
* ``constant``          - ignores the prompt (sends a fixed one upstream) but fakes prompt_tokens.
* ``ignore_max_tokens`` - generates more tokens than asked (a "free" longer answer).
* ``cache``             - replays stored replies to repeated requests, with a fresh id each time.
* ``lie_usage``         - doubles completion_tokens in usage (inflates the bench's token counts).
* ``wrong_model_name``  - /v1/models advertises a different model than the one declared.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from tokenizers import Tokenizer

FIXED_PROMPT = "def main():\n    "


def _count_prompt(tok: Tokenizer, prompt: Any) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(tok.encode(prompt).ids)


class Proxy:
    """The proxy's state: upstream session, mode, reply cache."""

    def __init__(self, upstream: str, mode: str, tokenizer_dir: str) -> None:
        self.upstream, self.mode = upstream.rstrip("/"), mode
        self.tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
        self.cache: dict[str, dict[str, Any]] = {}
        self.session: aiohttp.ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))

    async def stop(self, app: web.Application) -> None:
        assert self.session is not None
        await self.session.close()

    def _rewrite_request(self, body: dict[str, Any]) -> dict[str, Any]:
        body = dict(body)
        if self.mode == "constant":
            body["prompt"] = FIXED_PROMPT
        if self.mode == "ignore_max_tokens" and body.get("max_tokens"):
            body["max_tokens"] = int(body["max_tokens"]) + 7
        return body

    def _rewrite_usage(self, usage: dict[str, Any] | None, original: dict[str, Any]) -> None:
        if not usage:
            return
        if self.mode == "constant":
            # Hide the swapped prompt: report what the client sent.
            usage["prompt_tokens"] = _count_prompt(self.tok, original.get("prompt", ""))
        if self.mode == "lie_usage":
            usage["completion_tokens"] = 2 * int(usage.get("completion_tokens", 0))
        if "prompt_tokens" in usage and "completion_tokens" in usage:
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    async def get(self, request: web.Request) -> web.Response:
        assert self.session is not None
        async with self.session.get(self.upstream + request.path) as up:
            data = await up.json()
        if self.mode == "wrong_model_name" and request.path == "/v1/models":
            for m in data.get("data", []):
                m["id"] = "tiny-llama-70b-instruct"
        return web.json_response(data, status=up.status)

    async def post(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        original = await request.json()
        body = self._rewrite_request(original)
        if body.get("stream"):
            return await self._stream(request, body, original)
        key = request.path + json.dumps(original, sort_keys=True)
        if self.mode == "cache" and key in self.cache:
            reply = dict(self.cache[key], id=f"cmpl-{uuid.uuid4().hex}")
            return web.json_response(reply)
        async with self.session.post(self.upstream + request.path, json=body) as up:
            reply = await up.json()
            status = up.status
        if status == 200:
            self._rewrite_usage(reply.get("usage"), original)
            if self.mode == "cache":
                self.cache[key] = reply
        return web.json_response(reply, status=status)

    async def _stream(self, request: web.Request, body: dict[str, Any], original: dict[str, Any]) -> web.StreamResponse:
        assert self.session is not None
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async with self.session.post(self.upstream + request.path, json=body) as up:
            async for raw in up.content:
                line = raw.decode()
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    event = json.loads(line[5:])
                    self._rewrite_usage(event.get("usage"), original)
                    line = "data: " + json.dumps(event) + "\n"
                await resp.write(line.encode())
        await resp.write_eof()
        return resp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True, choices=["passthrough", "constant", "ignore_max_tokens", "cache",
                                                      "lie_usage", "wrong_model_name"])
    ap.add_argument("--tokenizer", required=True, help="model folder holding tokenizer.json")
    args = ap.parse_args()
    proxy = Proxy(args.upstream, args.mode, args.tokenizer)
    app = web.Application()
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_get("/{tail:.*}", proxy.get)
    app.router.add_post("/{tail:.*}", proxy.post)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
