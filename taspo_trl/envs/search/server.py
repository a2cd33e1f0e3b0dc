"""A small retrieval server speaking Search-R1's protocol over the embedded ``bm25s`` index (stdlib only).

``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents": '"Title"\\ntext'}, "score": s}, ...], ...]}`` (without scores,
each item is the document). ``GET /health`` reports the corpus size and ``GET /stats`` the number of
``/retrieve`` requests and queries served, which lets tests check that a turn's searches came in one request.

Run it with ``taspo-search-server --port 8000`` (or ``python -m taspo_trl.envs.search.server``) and point the
environment at it with ``retriever: http://127.0.0.1:8000``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from taspo_trl.envs.search.retrieval import BM25Retriever

MAX_BATCH = 4096
MAX_TOPK = 100


class RetrievalHTTPServer(ThreadingHTTPServer):
    """Serves one :class:`BM25Retriever`; counts requests under a lock (handlers run in threads)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], retriever: BM25Retriever, default_topk: int = 3) -> None:
        super().__init__(address, _Handler)
        self.retriever = retriever
        self.default_topk = default_topk
        self.requests_served = 0
        self.queries_served = 0
        self._count_lock = threading.Lock()

    def count(self, queries: int) -> None:
        with self._count_lock:
            self.requests_served += 1
            self.queries_served += queries


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet by default: a training run would otherwise log every turn's request."""

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
        try:
            length = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            queries = request["queries"]
            topk = int(request.get("topk") or self.server.default_topk)
            if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                raise ValueError("'queries' must be a list of strings")
            if len(queries) > MAX_BATCH or not 1 <= topk <= MAX_TOPK:
                raise ValueError(f"at most {MAX_BATCH} queries and 1 <= topk <= {MAX_TOPK}")
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as error:
            self._send(400, {"error": f"bad request: {error}; send {{\"queries\": [...], \"topk\": k}}"})
            return
        self.server.count(len(queries))
        try:
            found = self.server.retriever.retrieve(queries, topk)
        except Exception as error:  # noqa: BLE001 - report to the client instead of dropping the connection
            self._send(500, {"error": f"retrieval failed: {type(error).__name__}: {error}"})
            return
        with_scores = bool(request.get("return_scores", False))
        result = []
        for docs in found:
            # The embedded corpus has one page per entity, so the title doubles as the document id.
            items = [{"id": d.title, "contents": d.contents()} for d in docs]
            result.append([{"document": item, "score": d.score} for item, d in zip(items, docs)] if with_scores else items)
        self._send(200, {"result": result})


def main(argv: list[str] | None = None) -> None:
    """CLI: ``taspo-search-server [--host H] [--port P] [--corpus PATH] [--topk K]``; ``--port 0`` picks a free
    port. Prints ``listening on http://H:P`` once it accepts connections."""
    parser = argparse.ArgumentParser(prog="taspo-search-server", description="Serve a bm25s index over Search-R1's /retrieve protocol.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    parser.add_argument("--corpus", default=None, help="JSON-lines corpus (wiki-18 'contents' or 'title'+'text'); default: the embedded one")
    parser.add_argument("--topk", type=int, default=3, help="documents per query when a request names none")
    args = parser.parse_args(argv)
    retriever = BM25Retriever(args.corpus)
    server = RetrievalHTTPServer((args.host, args.port), retriever, args.topk)
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
