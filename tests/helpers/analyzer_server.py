"""A replay server speaking the OpenAI chat-completions protocol, for analyzer tests over real HTTP.

Run as a process (``python tests/helpers/analyzer_server.py``): it binds 127.0.0.1 on a free port and prints
``PORT <n>``. Tests script it over HTTP:

- ``POST /_script`` ``{"rules": [{"match": "<substring of the request's messages>", "responses": [...]}]}``
  replaces the script and zeroes the counters. Each response is ``{"content": str, "status": 200,
  "delay": seconds}``; a rule replays its responses in order, then repeats the last one. The first rule whose
  ``match`` occurs in the request's message text answers; no match is answered with HTTP 500.
- ``GET /_stats`` -> ``{"requests": n, "by_rule": [n_0, n_1, ...]}`` (chat requests received, timed out or not).
- ``GET /_bodies`` -> ``{"bodies": [...]}``: the JSON body of every chat request since the last script, in order.
- ``GET /health``; ``POST /v1/chat/completions``.

Error answers carry ``retry-after-ms: 10`` so the client's retries stay fast. ``ReplayServer`` starts and
stops the process for tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rules: list[dict[str, Any]] = []
        self.by_rule: list[int] = []
        self.bodies: list[dict[str, Any]] = []
        self.requests = 0

    def script(self, rules: list[dict[str, Any]]) -> None:
        with self.lock:
            self.rules, self.by_rule, self.bodies, self.requests = rules, [0] * len(rules), [], 0

    def pick(self, body: dict[str, Any]) -> dict[str, Any] | None:
        text = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        with self.lock:
            self.requests += 1
            self.bodies.append(body)
            for index, rule in enumerate(self.rules):
                if rule["match"] in text:
                    served = self.by_rule[index]
                    self.by_rule[index] += 1
                    return rule["responses"][min(served, len(rule["responses"]) - 1)]
        return None


STATE = _State()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and hung up; that is the point of slow responses

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {"status": "ok"})
        elif self.path == "/_stats":
            with STATE.lock:
                self._reply(200, {"requests": STATE.requests, "by_rule": list(STATE.by_rule)})
        elif self.path == "/_bodies":
            with STATE.lock:
                self._reply(200, {"bodies": list(STATE.bodies)})
        else:
            self._reply(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/_script":
            STATE.script(body["rules"])
            self._reply(200, {"ok": True})
        elif self.path.endswith("/chat/completions"):
            self._complete(body)
        else:
            self._reply(404, {"error": {"message": "not found"}})

    def _complete(self, body: dict[str, Any]) -> None:
        response = STATE.pick(body)
        if response is None:
            response = {"status": 500, "content": "no scripted response"}
        time.sleep(response.get("delay", 0))
        status = response.get("status", 200)
        if status != 200:
            error = {"error": {"message": response.get("content", "error"), "type": "server_error"}}
            self._reply(status, error, {"retry-after-ms": "10"})
            return
        self._reply(
            200,
            {
                "id": "chatcmpl-replay",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": response["content"]},
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            },
        )


class ReplayServer:
    """Starts the server in a child process on a free port; ``script`` / ``stats`` talk to it; ``close`` ends it."""

    def __init__(self) -> None:
        self._process = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)
        line = self._process.stdout.readline()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"replay server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        self.base_url = f"{self.url}/v1"

    def _call(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def script(self, rules: list[dict[str, Any]]) -> None:
        self._call("/_script", {"rules": rules})

    def stats(self) -> dict[str, Any]:
        return self._call("/_stats")

    def bodies(self) -> list[dict[str, Any]]:
        return self._call("/_bodies")["bodies"]

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)
        self._process.stdout.close()


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
