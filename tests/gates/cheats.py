"""A cheating (or merely interposed) proxy in front of a real hfserve, for the integrity tests.

``python tests/gates/cheats.py --upstream URL --port P --mode MODE --tokenizer DIR``

Modes, each a way a candidate could game the bench:

* ``passthrough``       - forwards everything (an extra process answering the port).
* ``constant``          - ignores the prompt (sends a fixed one upstream) but fakes prompt_tokens.
* ``ignore_max_tokens`` - generates more tokens than asked (a "free" longer answer).
* ``cache``             - replays stored replies to repeated requests, with a fresh id each time.
* ``lie_usage``         - doubles completion_tokens in usage (inflates the bench's token counts).
* ``wrong_model_name``  - /v1/models advertises a different model than the one declared.
* ``lie_usage_stream``  - doubles completion_tokens only in streamed responses.
* ``cache_len``         - replays the reply stored for any earlier prompt of the same length.
* ``cache_prefix``      - replays the reply stored for any earlier prompt with the same first 16
                          ids (or 48 characters of a chat message).
* ``split``             - scores prompts (``echo``) on ``--upstream`` but generates on
                          ``--generator``, a server of a smaller model: the teacher-forced check
                          sees the full model, the bench the small one.
* ``evade``             - honest for the gates' own requests (``echo`` scoring, and prompts of at most
                          40 ids: the generation probes are 33) and generates everything longer
                          (the bench's prompts) on ``--generator``: every gate passes, the bench
                          measures the small model. Only the bench audit (gates/audit.py) sees it.

The cache modes store and replay streamed replies too (as recorded events, fresh id).
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from proxybase import UpstreamProxy, serve
from tokenizers import Tokenizer

FIXED_PROMPT = "def main():\n    "
MODES = ("passthrough", "constant", "ignore_max_tokens", "cache", "lie_usage", "wrong_model_name",
         "lie_usage_stream", "cache_len", "cache_prefix", "split", "evade")
_ID = re.compile(rb'"id": ?"[^"]*"')


def _count_prompt(tok: Tokenizer, prompt: Any) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(tok.encode(prompt).ids)


class Proxy(UpstreamProxy):
    """The proxy's state: upstream session, mode, reply cache."""

    def __init__(self, upstream: str, mode: str, tokenizer_dir: str, generator: str | None = None) -> None:
        super().__init__(upstream, mode)
        self.generator = (generator or upstream).rstrip("/")
        self.tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
        self.cache: dict[str, Any] = {}

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
        if self.mode == "lie_usage" or (self.mode == "lie_usage_stream" and original.get("stream")):
            usage["completion_tokens"] = 2 * int(usage.get("completion_tokens", 0))
        if "prompt_tokens" in usage and "completion_tokens" in usage:
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    async def get(self, request: web.Request) -> web.Response:
        assert self.session is not None
        if self.mode in ("split", "evade") and request.path == "/health":
            # Healthy only once the generating server answers too (it may still be loading).
            try:
                async with self.session.get(self.generator + "/health") as gen:
                    if gen.status != 200:
                        return web.json_response({"status": "generator not ready"}, status=503)
            except aiohttp.ClientError:
                return web.json_response({"status": "generator not ready"}, status=503)
        async with self.session.get(self.upstream + request.path) as up:
            data = await up.json()
        if self.mode == "wrong_model_name" and request.path == "/v1/models":
            for m in data.get("data", []):
                m["id"] = "tiny-llama-70b-instruct"
        return web.json_response(data, status=up.status)

    def _cache_key(self, path: str, body: dict[str, Any]) -> str | None:
        """What the cache modes key on (None = this mode caches nothing)."""
        if self.mode == "cache":
            return path + json.dumps(body, sort_keys=True)
        if self.mode not in ("cache_len", "cache_prefix") or body.get("echo"):
            return None
        prompt = body.get("prompt")
        if prompt is None:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
        if self.mode == "cache_len":
            key: Any = len(prompt) if isinstance(prompt, list) else len(self.tok.encode(prompt).ids)
        else:
            key = prompt[:16] if isinstance(prompt, list) else prompt[:48]
        return f"{path} {body.get('stream')} {body.get('max_tokens')} {key}"

    def _upstream_for(self, body: dict[str, Any]) -> str:
        # The split cheat: prompt scoring goes to the full model, generation to the small one.
        if self.mode == "split":
            return self.upstream if body.get("echo") else self.generator
        # The evading cheat: the gates' requests (scoring, short probes) to the full model.
        if self.mode == "evade":
            short = _count_prompt(self.tok, body.get("prompt", "")) <= 40 if "prompt" in body else True
            return self.upstream if body.get("echo") or short else self.generator
        return self.upstream

    async def post(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        original = await request.json()
        body = self._rewrite_request(original)
        key = self._cache_key(request.path, original)
        if key is not None and key in self.cache:
            return await self._replay(request, self.cache[key])
        if body.get("stream"):
            return await self._stream(request, body, original, key)
        async with self.session.post(self._upstream_for(body) + request.path, json=body) as up:
            reply = await up.json()
            status = up.status
        if status == 200:
            self._rewrite_usage(reply.get("usage"), original)
            if key is not None:
                self.cache[key] = reply
        return web.json_response(reply, status=status)

    async def _replay(self, request: web.Request, stored: Any) -> web.StreamResponse:
        fresh = f'"id": "cmpl-{uuid.uuid4().hex}"'.encode()
        if isinstance(stored, dict):
            return web.json_response(dict(stored, id=f"cmpl-{uuid.uuid4().hex}"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for line in stored:
            await resp.write(_ID.sub(fresh, line))
        await resp.write_eof()
        return resp

    async def _stream(self, request: web.Request, body: dict[str, Any], original: dict[str, Any],
                      key: str | None) -> web.StreamResponse:
        assert self.session is not None
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        recorded: list[bytes] = []
        async with self.session.post(self._upstream_for(body) + request.path, json=body) as up:
            async for raw in up.content:
                line = raw.decode()
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    event = json.loads(line[5:])
                    self._rewrite_usage(event.get("usage"), original)
                    line = "data: " + json.dumps(event) + "\n"
                recorded.append(line.encode())
                await resp.write(line.encode())
        if key is not None:
            self.cache[key] = recorded
        await resp.write_eof()
        return resp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--tokenizer", required=True, help="model folder holding tokenizer.json")
    ap.add_argument("--generator", default=None, help="split mode: the server that generates")
    args = ap.parse_args()
    serve(Proxy(args.upstream, args.mode, args.tokenizer, args.generator), args.port)


if __name__ == "__main__":
    main()
