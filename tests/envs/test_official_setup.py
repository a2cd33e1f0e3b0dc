"""envs/: the official environments' setup scripts and check, run as a user runs them: argument handling, the
health checks against servers on loopback that speak the official protocols, and one-line errors when the data
or the server is missing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from taspo_trl.envs.webshop.catalog import load_catalog
from tests.helpers.webshop_site import OfficialFormatHandler

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "envs" / "check_setup.py"


def _check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def served():
    """Start an HTTP server in a thread; yields a function returning its URL."""
    servers = []

    def start(server):
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_no_environment_named_is_a_usage_error():
    result = _check()
    assert result.returncode == 2 and "usage:" in result.stderr


def test_negative_eval_count_is_refused():
    result = _check("search", "--url", "http://127.0.0.1:1", "--eval", "-1")
    assert result.returncode == 2 and "--eval must be 0 or more" in result.stderr


def test_alfworld_without_data_names_the_variable_and_the_guide():
    env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    line = _one_error_line(_check("alfworld", env=env))
    assert "ALFWORLD_DATA" in line and "envs/alfworld/README.md" in line


def test_alfworld_missing_or_empty_folder(tmp_path):
    assert str(tmp_path / "nowhere") in _one_error_line(_check("alfworld", "--data", str(tmp_path / "nowhere")))
    assert "no game.tw-pddl" in _one_error_line(_check("alfworld", "--data", str(tmp_path)))


def test_alfworld_games_reset_on_the_engine(tmp_path):
    from taspo_trl.envs.alfworld import generate_games

    generate_games(tmp_path / "json_2.1.1" / "valid_unseen", per_type=1, seed=0, split="eval_unseen",
                   task_types=["pick_and_place_simple"])
    result = _check("alfworld", "--data", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: 1 ALFWorld games under")


def test_webshop_check_opens_a_goal_on_a_site_with_the_official_routes(served):
    OfficialFormatHandler.catalog = load_catalog()
    url = served(ThreadingHTTPServer(("127.0.0.1", 0), OfficialFormatHandler))
    result = _check("webshop", "--url", url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: WebShop at {url} serves goal 0")


def test_webshop_check_says_to_start_the_site_when_nothing_listens():
    line = _one_error_line(_check("webshop", "--url", _closed_port_url()))
    assert "could not reach the WebShop server" in line and "envs/webshop/README.md" in line


def test_webshop_check_refuses_a_url_that_is_not_http():
    assert "http:// or https://" in _one_error_line(_check("webshop", "--url", "ftp://example"))


def test_search_check_against_the_bundled_retrieval_server(served):
    from taspo_trl.envs.search.retrieval import BM25Retriever
    from taspo_trl.envs.search.server import RetrievalHTTPServer

    url = served(RetrievalHTTPServer(("127.0.0.1", 0), BM25Retriever(None)))
    result = _check("search", "--url", url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: retriever at {url} answers /retrieve")


def test_search_check_says_to_start_the_retriever_when_nothing_listens():
    line = _one_error_line(_check("search", "--url", _closed_port_url()))
    assert "failed" in line and "envs/search/README.md" in line


@pytest.mark.parametrize("script, args, code, message", [
    ("alfworld/download.sh", [], 2, "usage: bash envs/alfworld/download.sh DIR"),
    ("webshop/setup.sh", ["/tmp/x"], 2, "usage: bash envs/webshop/setup.sh DIR small|all"),
    ("webshop/setup.sh", ["/tmp/x", "medium"], 2, "usage:"),
    ("webshop/start.sh", ["/nonexistent/WebShop"], 1, "is not a WebShop checkout: run envs/webshop/setup.sh"),
    ("search/setup.sh", ["--help"], 2, "usage: bash envs/search/setup.sh DIR"),
    ("search/start.sh", ["/nonexistent/search_r1"], 1, "e5_Flat.index is missing: run envs/search/setup.sh"),
])
def test_setup_scripts_check_their_arguments_before_any_download(script, args, code, message):
    result = subprocess.run(["bash", str(ROOT / "envs" / script), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
