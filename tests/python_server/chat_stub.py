"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 for
the tests of `record_episode` / `/v1/record`: every request gets the same
extraction reply, one that suits every prompt of the memory loop (task and
env extraction, distillation). Threaded, so concurrent records from many
processes are served at once; it stops itself after `max_seconds`.

As a script (tools/server-schemathesis.sh): prints its base URL, then serves
until killed or until --seconds have passed.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = {
    "activation_condition": "when the task at hand resembles this one",
    "execution_procedure": "1. look around\n2. do the obvious thing",
    "termination_condition": "the goal is reached",
    "content": "the room has what the task needs",
}


class ChatStub:
    def __init__(self, max_seconds=300.0):
        self.requests = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests += 1
                body = json.dumps({
                    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0,
                    "model": request.get("model", "stub"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": json.dumps(REPLY)}}],
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = "http://127.0.0.1:%d/v1" % self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(max_seconds, self._server.shutdown)
        self._timer.daemon = True
        self._timer.start()

    def env(self):
        """What a deltamem process needs to use this stub as its LLM."""
        return {"DELTAMEM_LLM_BASE_URL": self.url, "DELTAMEM_LLM_MODEL": "stub"}

    def close(self):
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args()
    stub = ChatStub(max_seconds=args.seconds)
    print(stub.url, flush=True)
    time.sleep(args.seconds)
