"""A small retrieval server speaking Search-R1's protocol over the embedded ``bm25s`` index (stdlib only).

``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents": '"Title"\\ntext'}, "score": s}, ...], ...]}`` (without scores,
each item is the document). ``GET /health`` reports the corpus size and ``GET /stats`` the number of
``/retrieve`` requests and queries served, which lets tests check that a turn's searches came in one request.

Run it with ``taspo-search-server --port 8000`` (or ``python -m taspo_trl.envs.search.server``) and point the
environment at it with ``retriever: http://127.0.0.1:8000``.

Every bad request gets a 4xx answer with a message: a missing, malformed or over-``MAX_BODY_BYTES``
``Content-Length``, a body that is not JSON (or nested too deeply to parse), and ``queries``/``topk`` out of
range. Each connection has a read timeout, so clients that connect and send nothing do not keep threads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .retrieval import BM25Retriever

MAX_BATCH = 4096
MAX_TOPK = 100
MAX_BODY_BYTES = 8 * 1024 * 1024  # a full batch of long questions is well under this
READ_TIMEOUT = 30.0
_BYTE_COUNT = re.compile(r"[0-9]{1,20}")  # ASCII digits only (str.isdigit also takes "²"), and few of them


class RetrievalHTTPServer(ThreadingHTTPServer):
    """Serves one :class:`BM25Retriever`; counts requests under a lock (handlers run in threads)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], retriever: BM25Retriever, default_topk: int = 3,
                 read_timeout: float = READ_TIMEOUT) -> None:
        if not 1 <= default_topk <= MAX_TOPK:
            raise ValueError(f"default topk must be from 1 to {MAX_TOPK}, got {default_topk}")
        if read_timeout <= 0:
            raise ValueError(f"read_timeout must be > 0 seconds, got {read_timeout}")
        super().__init__(address, _Handler)
        self.retriever = retriever
        self.default_topk = default_topk
        self.read_timeout = read_timeout
        self.requests_served = 0
        self.queries_served = 0
        self._count_lock = threading.Lock()

    def count(self, queries: int) -> None:
        with self._count_lock:
            self.requests_served += 1
            self.queries_served += queries


def parse_retrieve_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body; ``ValueError`` says what is wrong with it."""
    try:
        request = json.loads(body)
    except RecursionError:  # json's C scanner recurses once per nesting level
        raise ValueError("the JSON is nested too deeply") from None
    except ValueError as error:  # also UnicodeDecodeError, and integers longer than Python converts
        raise ValueError(f"the body is not JSON ({error})") from None
    if not isinstance(request, dict):
        raise ValueError(f"the body must be a JSON object, got a {type(request).__name__}")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("'queries' must be a list of strings")
    if len(queries) > MAX_BATCH:
        raise ValueError(f"at most {MAX_BATCH} queries per request, got {len(queries)}")
    topk = request.get("topk")
    if topk is None:
        topk = default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"'topk' must be an integer from 1 to {MAX_TOPK}, got {topk!r:.40}")
    return queries, topk, bool(request.get("return_scores", False))


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalHTTPServer

    def setup(self) -> None:
        # The socket timeout bounds every read: the request line, the headers and the body.
        self.timeout = self.server.read_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet by default: a training run would otherwise log every turn's request."""

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left; nobody to answer

    def _bad_request(self, status: int, problem: str) -> None:
        self._send(status, {"error": f"bad request: {problem}; send {{\"queries\": [...], \"topk\": k}}"})

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering why it cannot be read."""
        declared = self.headers.get("Content-Length")
        if declared is None:
            self._bad_request(411, "a Content-Length header is required")
            return None
        if not _BYTE_COUNT.fullmatch(declared.strip()):
            self._bad_request(400, f"Content-Length must be a byte count, got {declared[:40]!r}")
            return None
        length = int(declared)
        if length > MAX_BODY_BYTES:
            self._bad_request(413, f"the body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit; send fewer queries per request")
            return None
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self._bad_request(408, f"the body did not arrive within {self.server.read_timeout:g} s")
            return None
        if len(body) < length:
            self._bad_request(400, f"the body ended after {len(body)} of {length} bytes")
            return None
        return body

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok", "documents": len(self.server.retriever.documents)})
        elif self.path == "/stats":
            self._send(200, {"requests": self.server.requests_served, "queries": self.server.queries_served})
        else:
            self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve, GET /health or GET /stats"})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/retrieve":
            self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
            return
        body = self._read_body()
        if body is None:
            return
        try:
            queries, topk, with_scores = parse_retrieve_request(body, self.server.default_topk)
        except ValueError as error:
            self._bad_request(400, str(error))
            return
        self.server.count(len(queries))
        try:
            found = self.server.retriever.retrieve(queries, topk)
        except Exception as error:  # noqa: BLE001 - report to the client instead of dropping the connection
            self._send(500, {"error": f"retrieval failed: {type(error).__name__}: {error}"})
            return
        result = []
        for docs in found:
            # The embedded corpus has one page per entity, so the title doubles as the document id.
            items = [{"id": d.title, "contents": d.contents()} for d in docs]
            result.append([{"document": item, "score": d.score} for item, d in zip(items, docs)] if with_scores else items)
        self._send(200, {"result": result})


def main(argv: list[str] | None = None) -> None:
    """CLI: ``taspo-search-server [--host H] [--port P] [--corpus PATH] [--topk K] [--read-timeout S]``;
    ``--port 0`` picks a free port. Prints ``listening on http://H:P`` once it accepts connections."""
    parser = argparse.ArgumentParser(prog="taspo-search-server", description="Serve a bm25s index over Search-R1's /retrieve protocol.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    parser.add_argument("--corpus", default=None, help="JSON-lines corpus (wiki-18 'contents' or 'title'+'text'); default: the embedded one")
    parser.add_argument("--topk", type=int, default=3, help="documents per query when a request names none")
    parser.add_argument("--read-timeout", type=float, default=READ_TIMEOUT,
                        help="seconds a connection may take to send its request before it is closed")
    args = parser.parse_args(argv)
    retriever = BM25Retriever(args.corpus)
    server = RetrievalHTTPServer((args.host, args.port), retriever, args.topk, args.read_timeout)
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port} ({len(retriever.documents)} documents)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
