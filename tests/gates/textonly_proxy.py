"""An OpenAI server with `transformers serve`'s API surface, in front of any upstream server.

``python tests/gates/textonly_proxy.py --upstream URL --port P [--mode honest|stop_early]``

What it copies from transformers serve 5.24 (checked against the real one in
tests/targets/test_transformers_serve_real.py; docs/engines.md):

* ``ignore_eos``, ``min_tokens``, ``return_tokens_as_token_ids`` -> HTTP 422;
* a prompt given as token ids -> HTTP 400 ("prompt must be a string");
* ``logprobs`` / ``echo`` accepted and ignored: replies carry text and usage, no logprobs;
* streams end after the finish_reason + usage chunk, with no ``data: [DONE]``.

So the fast hfserve servers and the gates' damaged models and cheats can be judged the way a
text-only engine is (gates/api.py), honest and broken alike. ``--mode stop_early`` is a cheat
such an engine could try: it generates a third of what was asked and says it stopped at EOS.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from aiohttp import web
from proxybase import UpstreamProxy, serve

REFUSED = ("ignore_eos", "min_tokens", "return_tokens_as_token_ids")


class TextOnly(UpstreamProxy):
    def _strip(self, event: dict[str, Any], asked: int, stopped: bool) -> None:
        for ch in event.get("choices") or ():
            ch.pop("logprobs", None)
            if stopped and ch.get("finish_reason"):
                ch["finish_reason"] = "stop"
        usage = event.get("usage")
        if stopped and usage:  # billed like a real early stop: the tokens sent plus the EOS
            usage["completion_tokens"] = int(usage["completion_tokens"]) + 1
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    async def post(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        body = await request.json()
        refused = sorted(set(body) & set(REFUSED))
        if refused:
            return web.json_response({"detail": f"Unexpected fields in the request: {set(refused)}"}, status=422)
        if request.path.endswith("/completions") and "messages" not in body and not isinstance(body.get("prompt"), str):
            return web.json_response({"detail": "prompt must be a string."}, status=400)
        asked = int(body.get("max_tokens") or 16)
        # The upstream (hfserve or a cheat in front of it) is asked the usual way; what comes back
        # is cut down to what transformers serve returns.
        up_body = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs", "echo")}
        stopped = self.mode == "stop_early" and asked > 3
        if stopped:
            up_body["max_tokens"] = max(1, asked // 3)
        if body.get("stream"):  # transformers serve always ends a stream with usage
            up_body["stream_options"] = {"include_usage": True}
        if not body.get("stream"):
            async with self.session.post(self.upstream + request.path, json=up_body) as up:
                reply, status = await up.json(), up.status
            if status == 200:
                self._strip(reply, asked, stopped)
            return web.json_response(reply, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async with self.session.post(self.upstream + request.path, json=up_body) as up:
            async for raw in up.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                self._strip(event, asked, stopped)
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write_eof()
        return resp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="honest", choices=("honest", "stop_early"))
    args = ap.parse_args()
    serve(TextOnly(args.upstream, args.mode), args.port)


if __name__ == "__main__":
    main()
