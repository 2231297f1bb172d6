"""What the gate tests' aiohttp proxies share: an upstream session, GET forwarding, and serving."""

from __future__ import annotations

import aiohttp
from aiohttp import web


class UpstreamProxy:
    """A proxy in front of `upstream`; subclasses define `post` (and may override `get`)."""

    def __init__(self, upstream: str, mode: str) -> None:
        self.upstream, self.mode = upstream.rstrip("/"), mode
        self.session: aiohttp.ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))

    async def stop(self, app: web.Application) -> None:
        assert self.session is not None
        await self.session.close()

    async def get(self, request: web.Request) -> web.Response:
        assert self.session is not None
        async with self.session.get(self.upstream + request.path) as up:
            return web.json_response(await up.json(), status=up.status)

    async def post(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError


def serve(proxy: UpstreamProxy, port: int) -> None:
    """Run `proxy` on 127.0.0.1:`port` until killed."""
    app = web.Application()
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_get("/{tail:.*}", proxy.get)
    app.router.add_post("/{tail:.*}", proxy.post)
    web.run_app(app, host="127.0.0.1", port=port, print=None)
