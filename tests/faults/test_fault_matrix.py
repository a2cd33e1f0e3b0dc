"""Faults at the edges, tried with real processes, files and loopback servers: each ends one episode or one
request with a clear error, never the run, and nothing from outside reaches local files.

Areas: the WebShop site adapter (hostile pages and links), the analyzer's disk cache and API key, the
retrieval server (bad requests, idle connections, a damaged index) and the ALFWorld engine (process state,
command matching) and game files, and skill-bank files. Every case is bounded in time: sockets and child
processes carry timeouts. Servers in threads stop with the test process; servers in child processes stop
by themselves when this process goes away (their stdin closes) or after ``CHILD_LIFETIME`` seconds.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from taspo_trl.envs.webshop import WebShopServerEnv
from taspo_trl.envs.webshop.server import MAX_PAGE_BYTES

CHILD_LIFETIME = 600  # seconds; a child server outliving a killed test run stops by then at the latest
WAIT = 60  # seconds any single socket or child-process wait may take before the case fails


# ----------------------------------------------------------------------------------------------- helpers


class _Site(BaseHTTPRequestHandler):
    """Serves ``server.routes[path]`` = (status, headers, body), else ``server.home`` (the session page)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status, headers, body = self.server.routes.get(self.path, self.server.home)
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the adapter stopped reading an oversized page, as it should

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()


@contextmanager
def _site(home: str | bytes, content_type: str = "text/html; charset=utf-8", routes: dict | None = None) -> Iterator[str]:
    """A WebShop-like site on 127.0.0.1 (in a daemon thread, shut down on exit); yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    server.daemon_threads = True
    body = home.encode() if isinstance(home, str) else home
    server.home = (200, {"Content-Type": content_type}, body)
    server.routes = routes or {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _page(body: str) -> str:
    return f"<html><head><title>WebShop</title></head><body>{body}</body></html>"


def _product_link(href: str, name: str = "B0TARGET") -> str:
    return _page(f'<div id="instruction-text"><h4>Instruction: buy it</h4></div>'
                 f'<a class="product-link" href="{href}">{name}</a>')


_WATCHDOG = textwrap.dedent("""
    import os, runpy, sys, threading
    lifetime, kind, target, *argv = sys.argv[1:]
    # Stop by itself: when the test process goes away (stdin reaches EOF) or after `lifetime` seconds.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    timer = threading.Timer(float(lifetime), os._exit, (0,))
    timer.daemon = True
    timer.start()
    sys.argv = [target, *argv]
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
""")


class _ChildServer:
    """A server in a child process that stops by itself; ``first_line`` is what it printed on start."""

    def __init__(self, kind: str, target: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(CHILD_LIFETIME), kind, target, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        ready, _, _ = select.select([self.process.stdout], [], [], WAIT)
        self.first_line = self.process.stdout.readline().strip() if ready else ""
        if not self.first_line:
            self.close()
            raise RuntimeError(f"{target} printed nothing within {WAIT} s (exit code {self.process.poll()})")

    def close(self) -> None:
        self.process.stdin.close()  # the watchdog's cue; terminate in case the server ignores it
        self.process.terminate()
        try:
            self.process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=WAIT)
        self.process.stdout.close()


def _exchange(url: str, raw: bytes, half_close: bool = True) -> tuple[int, bytes]:
    """Send raw bytes to ``url``'s host and read the answer until the server closes: (status, body)."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=WAIT) as connection:
        connection.sendall(raw)
        if half_close:
            connection.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    fields = {"Content-Length": str(len(body)), **(headers or {})}
    head = "POST /retrieve HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items() if v is not None)
    return _exchange(url, head.encode() + b"\r\n" + body)


# ----------------------------------------------------------------------------------------------- WebShop


def _click_first(url: str) -> tuple[WebShopServerEnv, object]:
    env = WebShopServerEnv(url, 0, timeout=WAIT)
    env.reset()
    assert env.error is None, env.error
    target = next(c for c in env.admissible_commands if c.startswith("click["))
    return env, env.step(target)


def test_webshop_file_link_is_refused_and_its_content_never_shown(tmp_path, caplog):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-FILE-CONTENT-7f3a")
    for href in ("file:///etc/hostname", secret.as_uri()):
        with _site(_product_link(href)) as url, caplog.at_level(logging.WARNING, "taspo_trl.envs.webshop.server"):
            env, result = _click_first(url)
        assert result.done and result.reward == 0.0 and not result.info["won"]
        assert result.info["error"].startswith("refused to open") and href in result.info["error"]
        assert "SECRET-FILE-CONTENT" not in result.observation + json.dumps(result.info)
        assert "refused" in caplog.text
        caplog.clear()


def test_webshop_data_page_cannot_forge_a_score():
    forged = 'data:text/html,<h3 id="reward">Your score (min 0.0, max 1.0)<pre>1.0</pre></h3>'
    home = _page(f'<form method="post" action=\'{forged}\'><button class="btn">Buy Now</button></form>')
    with _site(home) as url:
        env = WebShopServerEnv(url, 0, timeout=WAIT)
        env.reset()
        assert "click[buy now]" in env.admissible_commands
        result = env.step("click[buy now]")
    assert result.done and result.reward == 0.0 and result.info["score"] == 0.0 and not result.info["won"]
    assert result.info["error"].startswith("refused to open 'data:")


@pytest.mark.parametrize("href", ["ftp://127.0.0.1:1/page", "//127.0.0.2/item", "http://localhost:1/item",
                                  "gopher://127.0.0.1/x", "javascript:alert(1)"])
def test_webshop_links_to_other_schemes_or_hosts_are_refused(href):
    with _site(_product_link(href)) as url:
        _, result = _click_first(url)
    assert result.done and result.info["error"].startswith("refused to open")


def test_webshop_redirects_only_within_the_origin():
    item = (200, {"Content-Type": "text/html"}, _page("<p>SAME-ORIGIN-ITEM</p>").encode())
    with _site(_page("<p>OTHER-ORIGIN-PAGE</p>")) as other:
        hops = {"b0away": ("/go-away", f"{other}/landing"), "b0file": ("/go-file", "file:///etc/hostname"),
                "b0home": ("/go-home", "/item")}
        links = "".join(f'<a class="product-link" href="{path}">{name}</a>' for name, (path, _) in hops.items())
        routes = {path: (302, {"Location": target}, b"") for path, target in hops.values()} | {"/item": item}
        with _site(_page(links), routes=routes) as url:
            env = WebShopServerEnv(url, 0, timeout=WAIT)
            results = {}
            for name in hops:
                env.reset()
                results[name] = env.step(f"click[{name}]")
    assert results["b0away"].info["error"].startswith(f"refused to open '{other}/landing'")
    assert "OTHER-ORIGIN-PAGE" not in results["b0away"].observation
    assert results["b0file"].info["error"].startswith("refused to open 'file:///etc/hostname'")
    assert "error" not in results["b0home"].info and "SAME-ORIGIN-ITEM" in results["b0home"].observation


@pytest.mark.parametrize("charset", ["x-bogus", "base64", "idna"])
def test_webshop_unknown_charset_reads_as_utf8(charset):
    with _site(_product_link("/item", "B0CAFÉ"), content_type=f"text/html; charset={charset}") as url:
        env = WebShopServerEnv(url, 0, timeout=WAIT)
        observation = env.reset()
    assert env.error is None and env.task == "buy it" and "B0CAFÉ" in observation


def test_webshop_page_over_the_cap_ends_the_episode():
    home = _page("<p>" + "x" * MAX_PAGE_BYTES + "</p>")
    with _site(home) as url:
        env = WebShopServerEnv(url, 0, timeout=WAIT)
        env.reset()
    assert env.error is not None and f"larger than {MAX_PAGE_BYTES} bytes" in env.error


def _reset_line_events(page: str) -> int:
    """Python lines this thread executes to open ``page`` from a loopback site: a machine-independent measure
    of the adapter's work (the site runs in its own thread, which is not traced)."""
    count = 0

    def tracer(frame, event, arg):  # noqa: ANN001, ANN202 - sys.settrace's signature
        nonlocal count
        count += event == "line"
        return tracer

    with _site(page) as url:
        env = WebShopServerEnv(url, 0, timeout=WAIT)
        sys.settrace(tracer)
        try:
            env.reset()
        finally:
            sys.settrace(None)
    assert env.error is None, env.error
    return count


@pytest.mark.parametrize("build", [
    lambda n: "<div>x" * n + "</div>" * n,
    lambda n: '<div id="instruction-text">' + "<span>w" * n,
    lambda n: "<div>" * n + "</p>" * n,
    lambda n: "<a" * n,
    lambda n: "</" * n,
    lambda n: "<!--x>" * n,
    lambda n: "<a b='x>" * n,
], ids=["nested", "nested-instruction", "unmatched-close", "open-tags", "open-end-tags", "open-comments", "open-quotes"])
def test_webshop_parsing_work_grows_linearly_with_the_page(build):
    # Four times the page must cost about four times the work (a quadratic parser costs sixteen times).
    small, large = _reset_line_events(build(500)), _reset_line_events(build(2000))
    assert large <= 5 * small, (small, large)


# ----------------------------------------------------------------------------------------------- analyzer

MESSAGES = [{"role": "user", "content": "list the key steps"}]
ANSWER = '{"items": []}'


class _Chat(BaseHTTPRequestHandler):
    """OpenAI chat completions: answers ``server.answers`` in order (the last repeats); records each request's
    Authorization header."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.authorizations.append(self.headers.get("Authorization"))
        status, content = self.server.answers[min(len(self.server.authorizations), len(self.server.answers)) - 1]
        if status == 200:
            payload = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}
        else:
            payload = {"error": {"message": content, "type": "server_error"}}
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def _chat_server(*answers: tuple[int, str]) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    server.daemon_threads = True
    server.answers, server.authorizations = list(answers), []
    server.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _analyzer(server: ThreadingHTTPServer, cache_dir: Path | None = None, api_key: str | None = None):
    from taspo_trl.privileged import OpenAICompatibleAnalyzer

    return OpenAICompatibleAnalyzer(server.base_url, "m", api_key=api_key, timeout=WAIT, max_retries=0, cache_dir=cache_dir)


def _cache_entry(cache_dir: Path) -> Path:
    (entry,) = cache_dir.rglob("*.json")
    return entry


@pytest.mark.parametrize("text", [{"items": []}, 42, ["a"], None, True])
def test_analyzer_cache_entry_with_non_text_is_asked_again(tmp_path, text):
    with _chat_server((200, ANSWER), (200, "fresh")) as server:
        assert _analyzer(server, tmp_path).complete(MESSAGES) == ANSWER
        _cache_entry(tmp_path).write_text(json.dumps({"model": "m", "text": text}))
        assert _analyzer(server, tmp_path).complete(MESSAGES) == "fresh"
        assert len(server.authorizations) == 2
    assert json.loads(_cache_entry(tmp_path).read_text())["text"] == "fresh"


@pytest.mark.parametrize("damage", [b"", b'{"model": "m", "te', b"\xff\xfe\x00garbage", b"[1, 2]", b'"text"'])
def test_analyzer_damaged_cache_entry_is_recomputed(tmp_path, damage):
    with _chat_server((200, ANSWER), (200, "recomputed")) as server:
        _analyzer(server, tmp_path).complete(MESSAGES)
        _cache_entry(tmp_path).write_bytes(damage)
        assert _analyzer(server, tmp_path).complete(MESSAGES) == "recomputed"
    assert json.loads(_cache_entry(tmp_path).read_text())["text"] == "recomputed"


def test_analyzer_cache_entry_whose_text_was_changed_is_asked_again(tmp_path, caplog):
    with _chat_server((200, ANSWER), (200, "recomputed")) as server:
        _analyzer(server, tmp_path).complete(MESSAGES)
        entry = json.loads(_cache_entry(tmp_path).read_text())
        entry["text"] = ANSWER.replace("[]", '["an item nobody asked for"]')  # valid JSON, another answer
        _cache_entry(tmp_path).write_text(json.dumps(entry))
        with caplog.at_level(logging.WARNING, "taspo_trl.privileged.analyzers"):
            assert _analyzer(server, tmp_path).complete(MESSAGES) == "recomputed"
    assert "does not match its SHA-256" in caplog.text
    assert json.loads(_cache_entry(tmp_path).read_text())["text"] == "recomputed"


def test_analyzer_empty_cached_answer_is_asked_again_once_per_run(tmp_path):
    from taspo_trl.privileged import AnalyzerError

    with _chat_server((200, ANSWER), (500, "down")) as server:
        _analyzer(server, tmp_path).complete(MESSAGES)
        _cache_entry(tmp_path).write_text(json.dumps({"model": "m", "text": ""}))
        run = _analyzer(server, tmp_path)
        with pytest.raises(AnalyzerError, match="InternalServerError"):  # asked again: the server is down
            run.complete(MESSAGES)
        with pytest.raises(AnalyzerError, match="empty"):  # not asked a third time in this run
            run.complete(MESSAGES)
        assert len(server.authorizations) == 2
        server.answers = [(200, ANSWER)] * 2 + [(200, "back up")]  # a later run asks once more, and it works
        assert _analyzer(server, tmp_path).complete(MESSAGES) == "back up"
        assert len(server.authorizations) == 3
    assert json.loads(_cache_entry(tmp_path).read_text())["text"] == "back up"


def test_builder_survives_an_analyzer_that_answers_with_non_text(embedded_tokenizer):
    from tests.helpers.kitchen import kitchen_group

    from taspo_trl.privileged import build_group_pi

    class DictAnalyzer:
        workers = 1

        def complete(self, messages):
            return {"items": []}

    result = build_group_pi(kitchen_group(), DictAnalyzer(), embedded_tokenizer)
    assert result.texts == [""] * 5 and result.stats.analyzer_errors == 1


_CACHE_RACE = textwrap.dedent("""
    import json, random, sys
    from taspo_trl.privileged import OpenAICompatibleAnalyzer
    role, index, cache_dir, key, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    analyzer = OpenAICompatibleAnalyzer("http://127.0.0.1:9/v1", "m", cache_dir=cache_dir)
    rng, bad = random.Random(index), 0
    for step in range(rounds):
        if role == "write":  # long answers, so a torn write would be visible
            analyzer._write_cache(key, f"writer {index} round {step} " + "x" * rng.randrange(1, 20000))
        else:
            text = analyzer._read_cache(key)
            bad += not (isinstance(text, str) and text.startswith("writer ") and text.rstrip("x").endswith(" "))
    print(json.dumps({"bad": bad}))
""")


def test_analyzer_cache_concurrent_writers_and_readers_see_only_whole_entries(tmp_path):
    from taspo_trl.privileged import OpenAICompatibleAnalyzer

    key = OpenAICompatibleAnalyzer("http://127.0.0.1:9/v1", "m").request_key(MESSAGES)
    OpenAICompatibleAnalyzer("http://127.0.0.1:9/v1", "m", cache_dir=tmp_path)._write_cache(key, "writer 9 round 0 x")
    roles = [("write", 0), ("write", 1), ("write", 2), ("read", 3), ("read", 4)]
    processes = [subprocess.Popen([sys.executable, "-c", _CACHE_RACE, role, str(i), str(tmp_path), key, "300"],
                                  stdout=subprocess.PIPE, text=True) for role, i in roles]
    outputs = [p.communicate(timeout=WAIT * 2)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * len(roles)
    assert sum(json.loads(out)["bad"] for out in outputs) == 0
    assert not list(tmp_path.rglob("*.tmp"))  # every temporary file was renamed into place


def test_api_key_stays_out_of_logs_errors_and_cache(tmp_path, caplog):
    from taspo_trl.privileged import AnalyzerError

    key = "sk-faultmatrix-0123456789abcdef"
    with _chat_server((500, "boom"), (401, "bad key"), (200, ANSWER)) as server, caplog.at_level(logging.DEBUG):
        analyzer = _analyzer(server, tmp_path, api_key=key)
        errors = []
        for _ in range(2):
            with pytest.raises(AnalyzerError) as caught:
                analyzer.complete(MESSAGES)
            errors.append(str(caught.value))
        assert analyzer.complete(MESSAGES) == ANSWER
        assert server.authorizations == [f"Bearer {key}"] * 3  # it did go to the server, and only there
    assert key not in caplog.text and not any(key in e for e in errors)
    assert all(key not in path.read_text(errors="replace") for path in tmp_path.rglob("*") if path.is_file())


def test_analyzer_never_sends_another_variables_key(monkeypatch, tmp_path):
    from taspo_trl import TASPOConfig

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-this-server")
    monkeypatch.delenv("TASPO_FAULT_MATRIX_KEY", raising=False)
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", analyzer="openai",
                  analyzer_base_url="http://127.0.0.1:9/v1", analyzer_model="m")
    with pytest.raises(ValueError, match=r"\$TASPO_FAULT_MATRIX_KEY, which is not set"):
        TASPOConfig(analyzer_api_key_env="TASPO_FAULT_MATRIX_KEY", **common)
    monkeypatch.setenv("TASPO_FAULT_MATRIX_KEY", "")
    with pytest.raises(ValueError, match="TASPO_FAULT_MATRIX_KEY"):
        TASPOConfig(analyzer_api_key_env="TASPO_FAULT_MATRIX_KEY", **common)
    TASPOConfig(analyzer_api_key_env="", **common)  # a keyless server is said so explicitly
    with _chat_server((200, ANSWER)) as server:  # and no key given means no key sent, whatever the environment
        _analyzer(server).complete(MESSAGES)
        assert server.authorizations == ["Bearer EMPTY"]


# ----------------------------------------------------------------------------------------------- retrieval server


@pytest.fixture(scope="module")
def retrieval_url() -> Iterator[str]:
    server = _ChildServer("module", "taspo_trl.envs.search.server", "--port", "0", "--read-timeout", "1")
    try:
        assert server.first_line.startswith("listening on http://127.0.0.1:"), server.first_line  # loopback by default
        yield server.first_line.split()[2]
    finally:
        server.close()


def _error(body: bytes) -> str:
    return json.loads(body)["error"]


@pytest.mark.parametrize("payload, problem", [
    (b'{"queries": ["Shukik"], "topk": Infinity}', "'topk' must be an integer from 1 to 100, got inf"),
    (b'{"queries": ["Shukik"], "topk": NaN}', "got nan"),
    (b'{"queries": ["Shukik"], "topk": 0}', "got 0"),
    (b'{"queries": ["Shukik"], "topk": -1}', "got -1"),
    (b'{"queries": ["Shukik"], "topk": 101}', "got 101"),
    (b'{"queries": ["Shukik"], "topk": 2.5}', "got 2.5"),
    (b'{"queries": ["Shukik"], "topk": "3"}', "got '3'"),
    (b'{"queries": ["Shukik"], "topk": true}', "got True"),
    (b'{"queries": ["Shukik"], "topk": 1' + b"0" * 5000 + b"}", "not JSON"),
    (b'{"queries": ["Shukik"], "topk": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b"[" * 100_000, "nested too deeply"),
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b'["Shukik"]', "must be a JSON object"),
    (b'{"queries": "Shukik"}', "'queries' must be a list of strings"),
    (b'{"queries": [1]}', "'queries' must be a list of strings"),
    (b'{"topk": 3}', "'queries' must be a list of strings"),
], ids=["topk-inf", "topk-nan", "topk-0", "topk-neg", "topk-101", "topk-float", "topk-str", "topk-bool",
        "topk-5000-digits", "nested-100k", "array-100k", "not-json", "not-utf8", "list", "queries-str",
        "queries-int", "no-queries"])
def test_retrieval_bad_bodies_get_400_with_a_message(retrieval_url, payload, problem):
    status, body = _post(retrieval_url, payload)
    assert status == 400 and problem in _error(body)


@pytest.mark.parametrize("length, status, problem", [
    (str(10**15), 413, "over the 8388608-byte limit"),
    (None, 411, "Content-Length header is required"),
    ("-5", 400, "must be a byte count"),
    ("1e3", 400, "must be a byte count"),
    ("²", 400, "must be a byte count"),
    ("9" * 5000, 400, "must be a byte count"),
], ids=["1e15", "missing", "negative", "float", "non-ascii-digit", "5000-digits"])
def test_retrieval_bad_content_length_gets_4xx(retrieval_url, length, status, problem):
    answer = _post(retrieval_url, b"", {"Content-Length": length})
    assert answer[0] == status and problem in _error(answer[1])


def test_retrieval_body_that_stops_short_or_stalls(retrieval_url):
    status, body = _post(retrieval_url, b'{"queries": ', {"Content-Length": "100"})  # then the client hangs up
    assert status == 400 and "ended after 12 of 100 bytes" in _error(body)
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    status, body = _exchange(retrieval_url, head, half_close=False)  # connected, silent: the read timeout ends it
    assert status == 408 and "did not arrive within 1 s" in _error(body)


def test_retrieval_idle_connections_are_closed_and_the_server_keeps_serving(retrieval_url):
    parts = urllib.parse.urlsplit(retrieval_url)
    partial = [b"", b"POST /retr", b"POST /retrieve HTTP/1.1\r\nContent-Le"]
    connections = [socket.create_connection((parts.hostname, parts.port), timeout=WAIT) for _ in range(50)]
    try:
        for index, connection in enumerate(connections):
            connection.sendall(partial[index % 3])
        # Each is closed by the server (recv returns b"" within the server's 1 s timeout, not the WAIT bound).
        assert all(connection.recv(1024) == b"" for connection in connections)
    finally:
        for connection in connections:
            connection.close()
    status, body = _post(retrieval_url, json.dumps({"queries": ["Shukik"], "topk": 1}).encode())
    assert status == 200 and json.loads(body)["result"][0][0]["contents"].startswith('"Shukik"')


@pytest.mark.parametrize("path", ["/../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd",
                                  "/health/../../etc/hostname", "/retrieve/../stats/../../etc/passwd"])
def test_retrieval_paths_outside_the_api_are_404(retrieval_url, path):
    status, body = _exchange(retrieval_url, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status == 404 and b"root:" not in body and "unknown path" in _error(body)


def _write_corpus(path: Path) -> Path:
    rows = [{"title": t, "text": text} for t, text in [
        ("Zebra", "The zebra is a striped horse of Africa."), ("Lion", "The lion hunts zebra at night."),
        ("Kettle", "A kettle boils water for tea."), ("Lamp", "A lamp gives light in a dark room.")]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _titles(retriever, query: str) -> list[str]:
    return [d.title for d in retriever.retrieve([query], 4)[0]]


@pytest.mark.parametrize("damage", ["truncated params", "garbage arrays", "another corpus", "missing vocab",
                                    "same-size bytes"])
def test_damaged_bm25_index_is_rebuilt_with_a_warning(tmp_path, caplog, damage):
    from taspo_trl.envs.search import BM25Retriever

    corpus, cache = _write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "cache"
    index_dir = BM25Retriever(corpus, cache_dir=cache).index_dir
    if damage == "truncated params":
        (index_dir / "params.index.json").write_text('{"k1": 1.5, "b"')
    elif damage == "garbage arrays":
        for array in index_dir.glob("*.npy"):
            array.write_bytes(b"\x93NUMPY garbage")
    elif damage == "another corpus":  # a well-formed index of a larger corpus under this corpus's name
        other = _write_corpus(tmp_path / "other.jsonl")
        with other.open("a") as handle:
            handle.write(json.dumps({"title": "Extra", "text": "one more"}) + "\n")
        other_dir = BM25Retriever(other, cache_dir=cache).index_dir
        for source in other_dir.iterdir():
            (index_dir / source.name).write_bytes(source.read_bytes())
    elif damage == "same-size bytes":  # loads without an error, and scores with the changed numbers
        array = index_dir / "data.csc.index.npy"
        data = bytearray(array.read_bytes())
        data[-4:] = b"\x00\x00\x80\x7f"  # +inf as the last float32 score
        array.write_bytes(bytes(data))
    else:
        (index_dir / "vocab.index.json").unlink()
    with caplog.at_level(logging.WARNING, "taspo_trl.envs.search.retrieval"):
        rebuilt = BM25Retriever(corpus, cache_dir=cache)
    assert "rebuilding it" in caplog.text
    assert _titles(rebuilt, "striped zebra")[:2] == ["Zebra", "Lion"] and _titles(rebuilt, "tea kettle") == ["Kettle"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "taspo_trl.envs.search.retrieval"):
        BM25Retriever(corpus, cache_dir=cache)  # the rebuilt index is used as is next time
    assert "rebuilding" not in caplog.text
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == []  # no staging left behind


# ----------------------------------------------------------------------------------------------- ALFWorld

# A pen on a shelf, to go in a desk: objects whose ids carry no "|x|y|z" suffix, which ALFWorld's demangler
# names "desk " (with a trailing space) rather than "desk 1".
NO_SUFFIX_PLAN = ["go to shelf", "take pen from shelf", "go to desk", "move pen to desk"]


@pytest.fixture(scope="module")
def no_suffix_game(tmp_path_factory) -> Path:
    pytest.importorskip("alfworld")
    from taspo_trl.envs.alfworld.generator import FloorPlan, Scene, TaskChoice, game_logic, problem_pddl
    from taspo_trl.envs.alfworld.tasks import add_task_to_grammar

    domain, grammar = game_logic()
    choice = TaskChoice("pick_and_place_simple", FloorPlan(0, "office", (), (), ()), "Pen", "Desk", "")
    scene = Scene(["Desk", "Shelf"], {"Desk": "loc|4|4|0|30", "Shelf": "loc|8|8|90|30"}, "loc|0|0|0|30",
                  {"Pen": "Shelf"}, {"Pen": "Pen"})
    game = {"pddl_domain": domain, "grammar": add_task_to_grammar(grammar, "put a pen in desk"),
            "pddl_problem": problem_pddl(choice, scene, "no_suffix")}
    path = tmp_path_factory.mktemp("no_suffix") / "game.tw-pddl"
    path.write_text(json.dumps(game))
    return path


def test_alfworld_commands_match_modulo_whitespace_and_case(no_suffix_game):
    from taspo_trl.envs.alfworld import ALFWorldEnv

    env = ALFWorldEnv(no_suffix_game, max_turns=10)
    env.reset()
    assert sorted(env.admissible_commands) == ["go to desk", "go to shelf", "help", "inventory", "look"]
    spellings = ["  Go To   Shelf ", "TAKE pen\tfrom shelf", "go to desk\n", "move pen to desk"]
    results = [env.step(command) for command in spellings]
    env.close()
    assert [r.observation for r in results[:3]] == [
        "You arrive at shelf. On the shelf, you see a pen.",
        "You pick up the pen from the shelf.",
        "You arrive at desk. On the desk, you see nothing.",
    ]
    assert results[-1].info["won"] and results[-1].reward == 1.0 and results[-1].done


def test_alfworld_planner_solves_the_suffixless_game(no_suffix_game):
    from taspo_trl.envs.alfworld.generator import check_solvable

    report = check_solvable(json.loads(no_suffix_game.read_text()))
    assert report.solvable and report.walkthrough == NO_SUFFIX_PLAN, report


def test_alfworld_engine_leaves_sys_argv_alone(no_suffix_game, monkeypatch):
    from taspo_trl.envs.alfworld import ALFWorldEnv
    from taspo_trl.envs.alfworld.generator import check_solvable

    argv = ["my_script.py", "--learning_rate", "1e-6"]
    monkeypatch.setattr(sys, "argv", argv)
    env = ALFWorldEnv(no_suffix_game)
    env.reset()
    assert sys.argv is argv
    env.step("go to shelf")
    env.close()
    check_solvable(json.loads(no_suffix_game.read_text()))  # replans with Fast Downward at every step
    assert sys.argv is argv and argv == ["my_script.py", "--learning_rate", "1e-6"]


@pytest.mark.parametrize("cut", [0, 1, 0.5, -1])
def test_truncated_game_file_fails_naming_the_file(no_suffix_game, tmp_path, cut):
    from taspo_trl.envs.alfworld import ALFWorldEnv, task_spec_rows

    text = no_suffix_game.read_text()
    path = tmp_path / "game.tw-pddl"
    path.write_text(text[: int(len(text) * cut) if isinstance(cut, float) else cut])
    for load in (ALFWorldEnv, lambda p: task_spec_rows([p])):
        with pytest.raises(ValueError, match=f"ALFWorld game file {path} is not valid JSON"):
            load(path)


# ----------------------------------------------------------------------------------------------- skill banks


@pytest.mark.parametrize("line, problem", [
    ('{"id": "s2", "env": "toy", "title": "t", "sk', "not valid JSON"),
    ('{"id": "s2", "env": "toy", "title": "t", "skill": 5}', "'skill' is not a string"),
    ("\x00\x01", "not valid JSON"),
    ("null", "expected a JSON object"),
])
def test_bad_skill_bank_line_is_named_with_file_and_line(tmp_path, line, problem):
    from taspo_trl.privileged.skillbank import SkillBank, SkillBankError

    path = tmp_path / "bank.jsonl"
    path.write_text(json.dumps({"id": "s1", "env": "toy", "title": "t", "skill": "do it"}) + "\n" + line)
    with pytest.raises(SkillBankError) as caught:
        SkillBank.load(str(path))
    assert str(caught.value).startswith(f"{path}:2: ") and problem in str(caught.value)


def test_child_servers_stop_by_themselves_when_the_test_process_goes_away():
    code = textwrap.dedent(f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {_WATCHDOG!r}, "{CHILD_LIFETIME}", "module",
                                  "taspo_trl.envs.search.server", "--port", "0"], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL)
        print(child.pid, flush=True)
    """)  # the parent exits at once, without closing anything on purpose
    parent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT)
    pid = int(parent.stdout)
    for _ in range(WAIT * 10):
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (exited, not yet reaped by init) counts as gone.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z" if Path(f"/proc/{pid}/stat").exists() else True


# ----------------------------------------------------------------------------------------------- model caches


def _cut_off(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _same_size_change(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # the last weights, zeroed: same size, same mtime granularity aside
    path.write_bytes(bytes(data))


MODEL_DAMAGE = {
    "cut-off weights": lambda folder: _cut_off(folder / "model.safetensors"),
    "same-size weights": lambda folder: _same_size_change(folder / "model.safetensors"),
    "missing tokenizer": lambda folder: (folder / "tokenizer.json").unlink(),
    "cut-off weights, no manifest": lambda folder: (_cut_off(folder / "model.safetensors"),
                                                     (folder / ".taspo_manifest.json").unlink(missing_ok=True)),
}


@pytest.fixture
def copying_conversion(tmp_path, monkeypatch, embedded_model_path):
    """The embedded model's cache in ``tmp_path``, its GGUF conversion replaced by a copy of the real cache's files
    (the same bytes, without the 30 s de-quantization); counts conversions."""
    from taspo_trl import models

    conversions = []

    def convert(gguf: Path, out: Path) -> None:
        conversions.append(out)
        shutil.copytree(embedded_model_path, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".taspo_manifest*"))

    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_find_gguf_file", lambda: Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    monkeypatch.setattr(models, "_export_gguf", convert)
    return conversions


@pytest.mark.parametrize("damage", list(MODEL_DAMAGE))
def test_damaged_embedded_model_cache_is_converted_again_with_a_warning(copying_conversion, capsys, damage,
                                                                          embedded_model_path):
    from taspo_trl.models import EMBEDDED_MODEL, resolve_embedded

    folder = Path(resolve_embedded(EMBEDDED_MODEL))
    MODEL_DAMAGE[damage](folder)
    capsys.readouterr()
    assert resolve_embedded(EMBEDDED_MODEL) == str(folder)
    assert "is damaged" in capsys.readouterr().err and len(copying_conversion) == 2
    real = Path(embedded_model_path)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (folder / name).read_bytes() == (real / name).read_bytes()
    resolve_embedded(EMBEDDED_MODEL)  # intact now: used as it is
    assert "damaged" not in capsys.readouterr().err and len(copying_conversion) == 2


def test_an_intact_cache_without_a_manifest_is_adopted(copying_conversion, capsys):
    from taspo_trl.models import EMBEDDED_MODEL, resolve_embedded

    folder = Path(resolve_embedded(EMBEDDED_MODEL))
    (folder / ".taspo_manifest.json").unlink()  # as a cache converted by an earlier taspo-trl
    capsys.readouterr()
    resolve_embedded(EMBEDDED_MODEL)
    assert "damaged" not in capsys.readouterr().err and len(copying_conversion) == 1
    assert (folder / ".taspo_manifest.json").is_file()


def test_damaged_warm_start_is_rebuilt_with_a_warning(tmp_path, monkeypatch, capsys, tiny_model_dir):
    from taspo_trl import warmstart

    builds = []

    def train(spec, out_dir: Path, games_dir: Path, bf16: bool | None = None):  # a stand-in for the SFT
        builds.append(out_dir)
        shutil.copytree(tiny_model_dir, out_dir)
        return warmstart.TrainedWarmStart(examples=1, data_sha256="0" * 64)

    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(warmstart, "train_warm_start", train)
    monkeypatch.setattr(warmstart, "_SHIPPED", tmp_path / "no-shipped-adapters")  # the build path, not the install
    name = "embedded:smollm2-135m-alfworld"
    folder = Path(warmstart.resolve_warm_start(name))
    assert warmstart.resolve_warm_start(name) == str(folder) and len(builds) == 1  # intact: no rebuild
    _cut_off(folder / "model.safetensors")
    capsys.readouterr()
    assert warmstart.resolve_warm_start(name) == str(folder)
    assert "is damaged" in capsys.readouterr().err and len(builds) == 2
    assert (folder / "model.safetensors").read_bytes() == (Path(tiny_model_dir) / "model.safetensors").read_bytes()


@pytest.fixture
def fake_encoder_package(tmp_path, monkeypatch):
    """An installed package ``fake-encoder`` (importable ``fake_encoder``) shipping a model folder, with the
    sizes and hashes of its files in a wheel-style ``RECORD``, as the shipped encoder package has."""
    import base64
    import hashlib
    import importlib

    package = tmp_path / "site" / "fake_encoder"
    model = package / "model"
    model.mkdir(parents=True)
    (package / "__init__.py").write_text("from pathlib import Path\n\ndef get_model_path():\n"
                                         "    return str(Path(__file__).parent / 'model')\n")
    (model / "config.json").write_text('{"hidden_size": 4}')
    (model / "model.safetensors").write_bytes(b"weights" * 1000)
    info = tmp_path / "site" / "fake_encoder-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-encoder\nVersion: 0.1\n")
    rows = []
    for path in sorted(package.rglob("*")):
        if path.is_file():
            digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            rows.append(f"{path.relative_to(tmp_path / 'site')},sha256={digest},{path.stat().st_size}")
    (info / "RECORD").write_text("\n".join(rows + ["fake_encoder-0.1.dist-info/RECORD,,"]) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    from taspo_trl.privileged import encoder

    monkeypatch.setattr(encoder, "DEFAULT_ENCODER_PACKAGE", "fake_encoder")
    monkeypatch.setattr(encoder, "DEFAULT_ENCODER_PIP", "fake-encoder")
    monkeypatch.delitem(sys.modules, "fake_encoder", raising=False)  # another test's copy
    encoder._check_shipped_files.cache_clear()
    return model


@pytest.mark.parametrize("damage", ["cut off", "same size", "missing"])
def test_damaged_shipped_encoder_fails_naming_the_file_and_the_reinstall(fake_encoder_package, damage):
    from taspo_trl.privileged import encoder

    assert encoder.default_model_path() == fake_encoder_package  # intact: passes
    weights = fake_encoder_package / "model.safetensors"
    if damage == "cut off":
        _cut_off(weights)
    elif damage == "same size":
        weights.write_bytes(b"WEIGHTS" * 1000)
    else:
        weights.unlink()
    encoder._check_shipped_files.cache_clear()  # a new process
    with pytest.raises(OSError) as caught:
        encoder.default_model_path()
    message = str(caught.value)
    assert str(weights) in message and "pip install --force-reinstall fake-encoder" in message and "\n" not in message


# ----------------------------------------------------------------------------------------------- run contract
# Settings under which a run did silently less, or more, than asked (issue 39); each now fails in one line naming
# the setting before any work, or says what the run will do.


def _setup_error(main, argv: list[str], program: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    message = str(caught.value.code)
    assert message.startswith(f"{program}: error: ") and "\n" not in message, message
    return message


def _grpo_config(tmp_path: Path, **overrides):
    from taspo_trl import AgentGRPOConfig

    return AgentGRPOConfig(**{"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": "none",
                              "per_device_train_batch_size": 2, "num_generations": 2, **overrides})


@pytest.mark.parametrize(("settings", "named"), [
    ({"max_steps": 0}, "max_steps 0 does not mean no training"),  # was: 3 epochs
    ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs 0 with max_steps -1 trains 0 steps"),  # was: 0 steps, exit 0
    ({"save_strategy": "best", "metric_for_best_model": "reward"}, "save_strategy best"),  # was: never saved
])
def test_budgets_and_save_settings_that_train_or_save_nothing_are_refused(tmp_path, settings, named):
    with pytest.raises(ValueError, match=named):
        _grpo_config(tmp_path, **settings)


@pytest.mark.parametrize(("flags", "named"), [
    (["--games_per_type", "0"], "games_per_type must be >= 1, got 0"),  # was: "could not start the first 0 ()"
    (["--max_tasks", "0"], "max_tasks must be >= 1, got 0"),  # was: trained on all 6 tasks
    (["--max_tasks", "-1"], "max_tasks must be >= 1, got -1"),  # was: trained on 5 of 6 tasks
    (["--resume_from_checkpoint", "true"], "holds no checkpoint-N folder"),  # was: a traceback after the model load
])
def test_train_task_selection_and_resume_settings_that_do_less_are_one_line(tmp_path, tiny_model_dir, flags, named):
    from taspo_trl.cli import train_main

    argv = ["--config", "alfworld_grpo_cpu", "--model_name_or_path", tiny_model_dir, "--games_dir",
            str(tmp_path / "games"), "--output_dir", str(tmp_path / "out"), *flags]
    assert named in _setup_error(train_main, argv, "taspo-train")
    assert not (tmp_path / "games").exists()  # before any game was generated


@pytest.mark.parametrize(("flags", "named"), [
    (["--max_tasks", "0"], "max_tasks must be >= 1, got 0"),  # was: "No tasks found ... with {<every setting>}"
    (["--max_tasks", "-2"], "max_tasks must be >= 1, got -2"),  # was: "Sample larger than population or is negative"
    (["--max_turns", "0"], "max_turns must be >= 1"),  # was: accepted
])
def test_eval_settings_that_give_no_episodes_are_one_line(tmp_path, tiny_model_dir, flags, named):
    from taspo_trl.evaluation import eval_main

    argv = ["--model_name_or_path", tiny_model_dir, "--environment", "search", "--results_dir", str(tmp_path / "eval"),
            *flags]
    assert named in _setup_error(eval_main, argv, "taspo-eval")
    assert not (tmp_path / "eval").exists()


def test_max_steps_over_an_sft_recipe_s_epochs_is_said(tmp_path, capsys):
    from taspo_trl.cli import train_main
    from taspo_trl.warmstart import WARM_STARTS

    argv = ["--config", "alfworld_sft_cpu", "--model_name_or_path", str(tmp_path / "no_model"), "--output_dir",
            str(tmp_path / "out"), "--max_steps", "2"]
    _setup_error(train_main, argv, "taspo-train")  # stopped by the missing model, after the run's settings were read
    epochs = f"{WARM_STARTS['embedded:smollm2-135m-alfworld'].num_train_epochs:g}"  # the recipe's, as the warm start's
    assert f"note: max_steps 2 overrides num_train_epochs {epochs}" in capsys.readouterr().err  # was: said nothing
