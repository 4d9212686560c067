"""The JSON plumbing the stand-in servers share (tests/standin_*_server.py): a quiet handler that reads and
writes JSON bodies. Each stand-in runs as a script from this folder, so it imports this module by name."""

from __future__ import annotations

import json
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread


class JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *a):  # the stand-ins print their own SGLang-like lines, not one per request
        pass

    def reply(self, code: int, body=None, content_type: str = "application/json") -> None:
        data = b"" if body is None else body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def json_body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")


@contextmanager
def not_found_server():
    """A local server that answers 404 to every GET: neither SGLang nor vLLM. Yields its URL."""

    class NotFound(JsonHandler):
        def do_GET(self):
            self.reply(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
