"""The server the standby tests launch (test_standby.py: LocalHost; test_ssh_standby.py: an SSH host).

A stdlib server that logs what a cold start decides by (argv, import path, cwd, __name__/__file__,
the environment, stdout's buffering), then answers /health; `crash` as its mode exits at start-up
instead. `decimal` stands in for torch: the module to preload.
"""

from pathlib import Path

SERVER = '''
import hashlib, http.server, json, os, sys
print("argv", sys.argv[0], sys.argv[2:], "path0", sys.path[0], "cwd", os.getcwd(), "name", __name__, "file", __file__)
print("env", hashlib.sha256(json.dumps(sorted(os.environ.items())).encode()).hexdigest(), os.environ.get("X_MODE"))
print("stdout buffered", not sys.stdout.line_buffering, file=sys.stderr)
import decimal
if sys.argv[2] == "crash":
    sys.exit("engine failed: boom")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(str(decimal.Decimal(1) / 8).encode())
    def log_message(self, *a):
        pass
print("ready", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''
PRELOAD = ["decimal", "http.server"]
LOG_LINES = 4
"""What a cold start of SERVER logs before it serves: argv..., env, buffering, ready."""


def write_server(folder: Path) -> Path:
    """SERVER as `folder/server.py`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "server.py"
    path.write_text(SERVER)
    return path

