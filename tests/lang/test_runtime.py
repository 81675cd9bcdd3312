"""``radixlm.lang.Runtime`` start-up checks that need no model."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

import radixlm.lang as rl


class _AnyServer(http.server.BaseHTTPRequestHandler):
    """Another HTTP server on the port: healthy, and a model info that looks like ours."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = b'{"model_path": "someone-else", "chat_template": null}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_taken_port_is_an_error_not_the_other_server():
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnyServer)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            rl.Runtime(port=port, timeout_s=30)  # was: "ready", talking to the other server
        assert time.monotonic() - start < 5  # refused before launching anything
    finally:
        other.shutdown()
        other.server_close()
