"""Shared fixtures: the embedded policy's tokenizer, a tiny random-weight model that uses it, and generated ALFWorld
games.

The first run on a machine converts the embedded GGUF model into the cache (~20-35 s, once); later sessions
load it from there in well under a second.
"""

from __future__ import annotations

import os

# The default run spreads the tests over two pytest-xdist workers (setup.cfg), one per core. Each worker and
# every process a test starts then gets one OpenMP thread: two threads per worker would oversubscribe the
# cores, where OpenMP threads spin instead of working.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

import pytest  # noqa: E402

from taspo_trl.models import EMBEDDED_MODEL  # noqa: E402
from taspo_trl.testing import make_tiny_model_dir  # noqa: E402
from taspo_trl.warmstart import resolve_policy_path  # noqa: E402


@pytest.fixture(scope="session")
def embedded_model_path() -> str:
    """Local directory of the converted embedded policy (SmolLM2-135M-Instruct)."""
    return resolve_policy_path(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def embedded_tokenizer(embedded_model_path):
    """The embedded policy's real tokenizer (byte-level BPE, ChatML chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded_model_path) -> str:
    """A tiny random-weight Llama saved with the embedded tokenizer, for fast forward passes."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"), tokenizer_source=embedded_model_path)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny encoder batches run as fast on one thread, and stay fast when other jobs load the CPU (OpenMP
    threads spin badly when the cores are oversubscribed); restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def encoder():
    """The shared offline sentence encoder (pays the sentence-transformers import once per session)."""
    from taspo_trl.privileged.encoder import get_encoder

    loaded = get_encoder()
    loaded.encode(["warm up"])
    return loaded


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("credit_quality")``: a script of ``benchmarks/`` (not a package) imported as a module."""
    import importlib.util
    from pathlib import Path

    import sys

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:  # as when the script runs: its own folder first, for the scripts it imports
        sys.path.insert(0, str(folder))

    def load(name: str):
        path = folder / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="module")
def family_games_dir(tmp_path_factory):
    """One generated ALFWorld train game per task family (6 tasks, as in the quickstart recipes), in a folder of
    its own, generated once per test module that uses it."""
    pytest.importorskip("alfworld")
    from taspo_trl.envs.alfworld import generate_games

    folder = tmp_path_factory.mktemp("games")
    generate_games(folder, per_type=1, seed=0, split="train")
    return folder


@pytest.fixture(scope="module")
def pick_and_place_game(tmp_path_factory):
    """The game file of one generated ALFWorld train game of the pick_and_place_simple family (seed 0), generated
    once per test module that uses it."""
    from taspo_trl.envs.alfworld import generate_games

    games = generate_games(
        tmp_path_factory.mktemp("games"), per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"]
    )
    return games[0]
