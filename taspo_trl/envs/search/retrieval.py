"""Retrievers for Search-QA: one small protocol, an embedded BM25 index and a client for Search-R1's server.

Both return, per query, the top documents as :class:`Document` (title, text, score). The HTTP client speaks the
protocol of Search-R1's ``search_r1/search/retrieval_server.py``: ``POST {url}/retrieve`` with
``{"queries": [...], "topk": k, "return_scores": true}`` answered by
``{"result": [[{"document": {"id": ..., "contents": '"Title"\\ntext'}, "score": s}, ...], ...]}`` (one list per
query; without scores each item is the document itself).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ...cache_manifest import check_folder, write_manifest
from ...jsonl import read_json_objects

logger = logging.getLogger(__name__)

EMBEDDED = "embedded"


@dataclass(frozen=True)
class Document:
    """One retrieved passage."""

    title: str
    text: str
    score: float = 0.0

    def contents(self) -> str:
        """The wiki-18 ``contents`` form: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'


class RetrievalError(RuntimeError):
    """The retriever could not answer (server down, timeout, malformed response); the env reports it."""


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        """The ``topk`` best documents for each query, best first (fewer when fewer match)."""
        ...


def parse_contents(contents: str) -> tuple[str, str]:
    """Split a wiki-18 ``contents`` string into (title, text); the title's surrounding quotes are dropped."""
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def read_corpus(path: str | Path) -> list[Document]:
    """Read a JSON-lines corpus: wiki-18 rows ``{"contents": '"Title"\\ntext'}`` or ``{"title", "text"}`` rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Search corpus not found: {path} (JSON lines with 'contents' or 'title'+'text').")
    docs = []
    for line_no, row in enumerate(read_json_objects(path, "one JSON object per document"), 1):
        if isinstance(row.get("contents"), str):
            docs.append(Document(*parse_contents(row["contents"])))
        elif isinstance(row.get("text"), str):
            docs.append(Document(str(row.get("title", "")), row["text"]))
        else:
            raise ValueError(f"Search corpus {path}, document {line_no}: needs a 'contents' or a 'text' field.")
    if not docs:
        raise ValueError(f"Search corpus {path} is empty.")
    return docs


def embedded_corpus_path() -> Path:
    """The fictional-encyclopedia corpus shipped in ``taspo_trl/data/search/corpus.jsonl``."""
    return Path(str(resources.files("taspo_trl") / "data" / "search" / "corpus.jsonl"))


def _tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class BM25Retriever:
    """A ``bm25s`` index over a JSON-lines corpus (the embedded one by default).

    The index is built once per corpus content and cached under ``cache_root()/search/bm25-<hash>``; the cache
    directory appears through an atomic rename, so concurrent builders never see a half-written index. A cached
    index that does not match its manifest (``taspo_trl.cache_manifest``: a file cut off, changed or missing) or
    cannot be loaded (another corpus's documents) is rebuilt with a warning.
    """

    def __init__(self, corpus_path: str | Path | None = None, cache_dir: str | Path | None = None) -> None:
        self.corpus_path = Path(corpus_path) if corpus_path else embedded_corpus_path()
        self.documents = read_corpus(self.corpus_path)
        digest = hashlib.sha256(self.corpus_path.read_bytes()).hexdigest()[:16]
        if cache_dir is None:
            # Imported here: taspo_trl.models imports torch, which the env and server otherwise never need.
            from ...models import cache_root

            cache_dir = cache_root() / "search"
        root = Path(cache_dir)
        self.index_dir = root / f"bm25-{digest}"
        if not (self.index_dir / "params.index.json").is_file():
            self._build(root)
        try:
            self._index = self._load()
        except Exception as error:  # noqa: BLE001 - the index is derived data: whatever is wrong with it, rebuild
            logger.warning("the bm25 index %s is unusable (%s: %s); rebuilding it", self.index_dir, type(error).__name__, error)
            self._discard(root)
            self._build(root)
            self._index = self._load()
        # bm25s's scorer is not documented as thread-safe; the threaded server shares one retriever.
        self._lock = threading.Lock()

    def _load(self) -> Any:
        import bm25s

        if problem := check_folder(self.index_dir):
            raise ValueError(problem)
        index = bm25s.BM25.load(str(self.index_dir), show_progress=False)
        if index.scores.get("num_docs") != len(self.documents):  # it would answer with ids past the corpus
            raise ValueError(f"it indexes {index.scores.get('num_docs')} documents, the corpus has {len(self.documents)}")
        return index

    def _discard(self, root: Path) -> None:
        # Renamed away first, so no other process loads it half-deleted.
        trash = Path(tempfile.mkdtemp(prefix=".bm25-stale-", dir=root))
        try:
            os.rename(self.index_dir, trash / "index")
        except FileNotFoundError:
            pass  # another process discarded it already
        finally:
            shutil.rmtree(trash, ignore_errors=True)

    def _build(self, root: Path) -> None:
        import bm25s

        root.mkdir(parents=True, exist_ok=True)
        index = bm25s.BM25()
        index.index(_tokenize([d.title + "\n" + d.text for d in self.documents]), show_progress=False)
        staging = Path(tempfile.mkdtemp(prefix=".bm25-", dir=root))
        try:
            index.save(str(staging), show_progress=False)
            write_manifest(staging)
            os.rename(staging, self.index_dir)
        except OSError:
            # Another process finished the same index first; theirs is identical.
            if not (self.index_dir / "params.index.json").is_file():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        if not queries:
            return []
        k = max(1, min(int(topk), len(self.documents)))
        vocab = self._index.vocab_dict
        # Unknown tokens are dropped; a query left with none matches nothing (bm25s needs at least one token).
        tokens = [[t for t in q if t in vocab] for q in _tokenize(list(queries))]
        results: list[list[Document]] = [[] for _ in queries]
        known = [i for i, t in enumerate(tokens) if t]
        if not known:
            return results
        with self._lock:
            ids, scores = self._index.retrieve([tokens[i] for i in known], k=k, show_progress=False, n_threads=1)
        for row, i in enumerate(known):
            results[i] = [
                Document(self.documents[d].title, self.documents[d].text, float(s))
                for d, s in zip(ids[row].tolist(), scores[row].tolist())
                if s > 0
            ]
        return results


class HttpRetriever:
    """Client of a Search-R1-style retrieval server: one ``POST {url}/retrieve`` per batch of queries.

    Connection errors, timeouts and 5xx answers are retried ``retries`` times, waiting ``backoff`` seconds
    before the first retry and twice as long before each next one; then, like 4xx answers and malformed bodies, they raise
    :class:`RetrievalError`, which the environment turns into an observation.
    """

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.5) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Retrieval server URL must start with http:// or https://, got {url!r}.")
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)

    def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": int(topk), "return_scores": True}).encode()
        payload = self._post(body)
        result = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(result, list) or len(result) != len(queries) or not all(isinstance(r, list) for r in result):
            raise RetrievalError(f"malformed response from {self.url}: expected 'result' with {len(queries)} lists")
        return [[_document(item) for item in per_query][:topk] for per_query in result]

    def _post(self, body: bytes) -> Any:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as error:
                last = f"HTTP {error.code} from {self.url}"
                if error.code < 500:
                    break
                continue
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, cut short
                reason = error.reason if isinstance(error, urllib.error.URLError) else error
                last = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
                last += f" ({self.url})"
                continue
            try:
                return json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise RetrievalError(f"malformed response from {self.url}: {error}") from error
        raise RetrievalError(f"{last} after {self.retries + 1} attempt(s)")


def _document(item: Any) -> Document:
    if not isinstance(item, dict):
        raise RetrievalError(f"malformed document in response: {str(item)[:80]!r}")
    doc = item.get("document", item)
    try:
        score = float(item.get("score", 0.0))
    except (TypeError, ValueError):
        score = 0.0
    if isinstance(doc, dict) and isinstance(doc.get("contents"), str):
        return Document(*parse_contents(doc["contents"]), score=score)
    if isinstance(doc, dict) and isinstance(doc.get("text"), str):
        return Document(str(doc.get("title", "")), doc["text"], score)
    raise RetrievalError(f"malformed document in response: {str(item)[:80]!r}")


_RETRIEVERS: dict[tuple[Any, ...], Retriever] = {}
_RETRIEVERS_LOCK = threading.Lock()


def check_retriever_spec(spec: str) -> str:
    """The kind of a retriever spec, ``"embedded"`` or ``"http"``; a ``ValueError`` naming the accepted forms
    for anything else, and for an ``embedded:PATH`` whose corpus file does not exist."""
    spec = spec.strip()
    if spec == EMBEDDED:
        return EMBEDDED
    if spec.startswith(EMBEDDED + ":"):
        corpus = Path(spec[len(EMBEDDED) + 1 :]).expanduser()
        if not corpus.is_file():
            raise ValueError(f"retriever {spec!r}: no corpus file at {corpus}.")
        return EMBEDDED
    if urllib.parse.urlsplit(spec).scheme in ("http", "https") and urllib.parse.urlsplit(spec).netloc:
        return "http"
    raise ValueError(
        f"Unknown retriever {spec!r}: use 'embedded', 'embedded:/path/corpus.jsonl' or the http(s) URL of a "
        "retrieval server such as http://127.0.0.1:8000."
    )


def get_retriever(spec: str = EMBEDDED, timeout: float = 10.0, retries: int = 2, backoff: float = 0.5) -> Retriever:
    """The process-wide retriever for ``spec`` (``"embedded"``, a corpus path as ``"embedded:PATH"``, or an
    http(s) URL), built on first use: the env factory runs once per episode and must not rebuild indexes."""
    spec = spec.strip()
    if check_retriever_spec(spec) == EMBEDDED:
        key: tuple[Any, ...] = (EMBEDDED, spec[len(EMBEDDED) + 1 :] or None)
    else:
        key = ("http", spec, float(timeout), int(retries), float(backoff))
    with _RETRIEVERS_LOCK:
        if key not in _RETRIEVERS:
            _RETRIEVERS[key] = BM25Retriever(key[1]) if key[0] == EMBEDDED else HttpRetriever(spec, timeout, retries, backoff)
        return _RETRIEVERS[key]
