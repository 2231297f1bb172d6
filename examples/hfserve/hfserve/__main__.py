"""``python -m hfserve ARGS``: the server (``hfserve.server.main``)."""

from .server import main

main()
