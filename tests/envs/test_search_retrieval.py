"""The HTTP retriever against real local servers: ``taspo_trl.envs.search.server`` in a subprocess, a port with
nothing listening, and tiny in-test servers that are slow, fail or answer garbage."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from taspo_trl.envs.base import task_spec_from_row
from taspo_trl.envs.search import (
    BM25Retriever,
    HttpRetriever,
    RetrievalError,
    SearchQAEnv,
    get_retriever,
    play_oracle,
    search_env_factory,
    search_task_rows,
)
from taspo_trl.envs.search.server import RetrievalHTTPServer


@pytest.fixture(scope="module")
def server_url():
    """The embedded index served by ``python -m taspo_trl.envs.search.server --port 0`` in a subprocess."""
    process = subprocess.Popen(
        [sys.executable, "-m", "taspo_trl.envs.search.server", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = _read_line(process, timeout=60)
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[2]
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines:
        raise TimeoutError(f"retrieval server did not start within {timeout} s (exit code {process.poll()})")
    return lines[0].strip()


def _stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as response:
        return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _tiny_server(handler_post):
    """A stdlib server in a thread whose POST handler is ``handler_post(handler, attempt_number)``."""
    attempts = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            attempts.append(time.monotonic())
            handler_post(self, len(attempts))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", attempts
    finally:
        server.shutdown()
        server.server_close()


def _reply(handler: BaseHTTPRequestHandler, status: int, payload) -> None:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):  # the client timed out and left, as the test wants
        pass


def test_http_matches_the_in_process_index(server_url):
    queries = ["Shukik", "capital of Karam", "nothing-matches-qqqzzz"]
    over_http = HttpRetriever(server_url).retrieve(queries, 3)
    local = BM25Retriever().retrieve(queries, 3)
    assert [[(d.title, d.text) for d in docs] for docs in over_http] == [[(d.title, d.text) for d in docs] for docs in local]
    assert over_http[0][0].title == "Shukik" and over_http[0][0].score > 0 and over_http[2] == []


def test_oracle_over_http(server_url):
    specs = [task_spec_from_row(r) for r in search_task_rows(split="test", max_tasks=30, retriever=server_url)]
    wins = 0
    for spec in specs:
        env = search_env_factory(spec)
        assert isinstance(env.retriever, HttpRetriever)
        env.reset()
        wins += play_oracle(env, spec).info["won"]
    assert wins == len(specs)


def test_step_many_sends_one_request_per_turn(server_url):
    specs = [task_spec_from_row(r) for r in search_task_rows(split="test", max_tasks=10, retriever=server_url)]
    envs = [search_env_factory(s) for s in specs]
    for env in envs:
        env.reset()
    actions = [f"<search>{s['question']}</search>" for s in specs[:8]] + ["<answer>x</answer>", ""]
    before = _stats(server_url)
    results = SearchQAEnv.step_many(envs, actions)
    after = _stats(server_url)
    assert after["requests"] - before["requests"] == 1
    assert after["queries"] - before["queries"] == 8
    assert all(r.observation.startswith("<information>Doc 1(Title: ") for r in results[:8])
    assert results[8].done and "Invalid action" in results[9].observation


def test_server_rejects_bad_requests(server_url):
    for body in (b"{not json", json.dumps({"queries": "one"}).encode(), json.dumps({"topk": 3}).encode()):
        request = urllib.request.Request(f"{server_url}/retrieve", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
        assert caught.value.code == 400
    with urllib.request.urlopen(f"{server_url}/health", timeout=5) as response:
        assert json.loads(response.read())["documents"] > 1000
    request = urllib.request.Request(f"{server_url}/retrieve", data=json.dumps({"queries": ["Shukik"], "topk": 2}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        docs = json.loads(response.read())["result"][0]
    assert len(docs) == 2 and docs[0]["contents"].startswith('"Shukik"\n')  # without scores: bare documents


def test_server_down_gives_an_error_observation_and_the_episode_goes_on():
    url = f"http://127.0.0.1:{_free_port()}"
    env = search_env_factory({"question": "q?", "golden_answers": ["Paris"], "retriever": url, "timeout": 1, "retries": 1, "backoff": 0.01})
    env.reset()
    start = time.monotonic()
    result = env.step("<search>anything</search>")
    assert time.monotonic() - start < 5
    assert result.observation.startswith("<information>retrieval failed: ") and "2 attempt(s)" in result.observation
    assert not result.done and result.info["retrieval_error"]
    final = env.step("<answer>paris</answer>")
    assert final.done and final.reward == 1.0


def test_slow_server_times_out_and_the_episode_ends_cleanly():
    def slow(handler, attempt):
        time.sleep(1.5)
        _reply(handler, 200, {"result": [[]]})

    with _tiny_server(slow) as (url, attempts):
        retriever = HttpRetriever(url, timeout=0.3, retries=1, backoff=0.05)  # shared, as get_retriever makes it
        envs = [SearchQAEnv("q?", ["x"], retriever, max_turns=2) for _ in range(3)]
        start = time.monotonic()
        results = SearchQAEnv.step_many(envs, ["<search>a</search>"] * 3)
        elapsed = time.monotonic() - start
        assert elapsed < 1.4, elapsed
        assert len(attempts) == 2  # one batched request for the three searches, retried once
        assert all("retrieval failed: RetrievalError: " in r.observation and "timed out" in r.observation for r in results)
        final = SearchQAEnv.step_many(envs, ["<search>b</search>"] * 3)
        assert all(r.done and r.info["truncated"] and r.reward == 0.0 for r in final)


def test_server_errors_are_retried_with_backoff():
    def flaky(handler, attempt):
        if attempt < 3:
            _reply(handler, 503, {"error": "busy"})
        else:
            _reply(handler, 200, {"result": [[{"document": {"id": "1", "contents": '"Paris"\nParis is a city.'}, "score": "7.5"}]]})

    with _tiny_server(flaky) as (url, attempts):
        docs = HttpRetriever(url, timeout=2, retries=2, backoff=0.05).retrieve(["paris"], 3)
        assert docs[0][0].title == "Paris" and docs[0][0].text == "Paris is a city." and docs[0][0].score == 7.5
        assert len(attempts) == 3 and attempts[2] - attempts[1] >= attempts[1] - attempts[0] >= 0.05


@pytest.mark.parametrize(
    ("status", "payload", "match"),
    [
        (404, {"detail": "Not Found"}, "HTTP 404"),
        (200, b"<html>oops</html>", "malformed response"),
        (200, {"results": []}, "malformed response"),
        (200, {"result": [[{"document": {"id": 1}}]]}, "malformed document"),
    ],
)
def test_bad_answers_raise_retrieval_error_without_retrying_4xx(status, payload, match):
    with _tiny_server(lambda handler, attempt: _reply(handler, status, payload)) as (url, attempts):
        with pytest.raises(RetrievalError, match=match):
            HttpRetriever(url, timeout=2, retries=3, backoff=0.01).retrieve(["q"], 3)
        assert len(attempts) == 1
        env = SearchQAEnv("q?", ["x"], HttpRetriever(url, timeout=2, retries=0))
        assert env.step("<search>q</search>").observation.startswith("<information>retrieval failed")


def test_retrievers_are_cached_per_config():
    assert get_retriever("embedded") is get_retriever("embedded")
    a = get_retriever("http://127.0.0.1:9/", timeout=1)
    assert a is get_retriever("http://127.0.0.1:9/", timeout=1) and a is not get_retriever("http://127.0.0.1:9/", timeout=2)
    assert a.url == "http://127.0.0.1:9/retrieve"
    with pytest.raises(ValueError):
        HttpRetriever("127.0.0.1:8000")


def test_server_with_a_custom_corpus(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"title": "Zebra", "text": "Zebras are striped."}, {"title": "Lion", "text": "Lions roar."}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    server = RetrievalHTTPServer(("127.0.0.1", 0), BM25Retriever(corpus, cache_dir=tmp_path / "cache"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        docs = HttpRetriever(f"http://127.0.0.1:{server.server_address[1]}", timeout=5, retries=0).retrieve(["striped zebra"], 1)
    finally:
        server.shutdown()
        server.server_close()
    assert [[d.title for d in per_query] for per_query in docs] == [["Zebra"]]


def test_env_pool_batches_a_turn_into_one_request(server_url):
    from taspo_trl.envs import get_env_factory
    from taspo_trl.rollout.env_pool import EnvPool

    specs = [task_spec_from_row(r) for r in search_task_rows(split="test", max_tasks=6, retriever=server_url)]
    pool = EnvPool(get_env_factory("search"))
    starts = pool.start(dict(enumerate(specs)))
    assert all(s.error is None and s.action_tags == ("search", "answer") and "<information>" in s.instructions for s in starts.values())
    before = _stats(server_url)
    results = pool.step({k: f"<search>{s['question']}</search>" for k, s in enumerate(specs)})
    assert _stats(server_url)["requests"] - before["requests"] == 1
    assert all(r.observation.startswith("<information>") and not r.done for r in results.values())
    pool.close(list(starts))


def test_training_step_survives_a_dead_retrieval_server(tmp_path, tiny_model_dir, monkeypatch):
    """A GRPO step on Search-QA whose retriever is down: every search gets the error observation, the episodes
    still answer, and the optimizer step completes."""
    from tests.helpers.cpu_config import cpu_trainer_kwargs
    from datasets import Dataset
    from tests.helpers.toy_envs import ScriptedGenerator

    import taspo_trl.trainers.grpo as grpo_module
    from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer

    url = f"http://127.0.0.1:{_free_port()}"
    rows = search_task_rows(split="test", max_tasks=1, retriever=url, timeout=0.5, retries=0)
    args = AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path, environment="search", max_turns=2, max_completion_length=16))
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=args, train_dataset=Dataset.from_list(rows))
    responses = ["<think>look it up</think><search>founder</search>", "<answer>nobody</answer>"]
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _t, batch_size=None: ScriptedGenerator(trainer.processing_class, responses))
    try:
        trainer.train()
    finally:
        trainer.close()
    assert trainer.state.global_step == 1
    trajectories = trainer.last_step.trajectories
    assert all(t.turns[0].observation.startswith("<information>retrieval failed") for t in trajectories)
    assert all(t.num_turns == 2 and t.error is None for t in trajectories)
