"""The warm-started policy cache: built on first use into place atomically, reused while its fingerprint
holds, rebuilt when a setting changes, and never left half-written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from taspo_trl import warmstart
from taspo_trl.models import resolve_model_path

NAME = "embedded:tiny-pick-and-place"


@pytest.fixture
def tiny_warm_start(monkeypatch, tmp_path, tiny_model_dir):
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    spec = warmstart.WarmStart(
        environment="alfworld", base_model=tiny_model_dir, games_per_type=1, games_seed=0, layout="turn",
        history_window=1, num_train_epochs=1, learning_rate=1e-3, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, seed=0, task_types=("pick_and_place_simple",),
    )
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, spec)
    return spec


def _record(path: str) -> dict:
    return json.loads((Path(path) / "warm_start.json").read_text())


def test_built_once_then_reused_then_rebuilt_when_a_setting_changes(tiny_warm_start, tiny_model_dir, monkeypatch):
    path = resolve_model_path(NAME)
    assert Path(path) == warmstart.warm_start_dir(NAME) and Path(path).name == "tiny-pick-and-place"
    first = _record(path)
    assert first["examples"] == 5  # the pick-and-place walkthrough of seed 0 has five commands
    trained = AutoModelForCausalLM.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any((a - b).abs().max() > 0 for a, b in zip(trained.parameters(), base.parameters()))

    assert resolve_model_path(NAME) == path and _record(path) == first  # reused: same record, no rebuild
    assert [p.name for p in Path(path).parent.iterdir() if not p.name.endswith(".lock")] == [Path(path).name]

    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(tiny_warm_start, learning_rate=2e-3))
    assert resolve_model_path(NAME) == path
    second = _record(path)
    assert second["fingerprint"]["settings"]["learning_rate"] == 2e-3 != first["fingerprint"]["settings"]["learning_rate"]


def test_a_failed_build_leaves_nothing_behind(tiny_warm_start, monkeypatch, tmp_path):
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(tiny_warm_start, base_model=str(tmp_path / "missing")))
    with pytest.raises(OSError):
        resolve_model_path(NAME)
    models = warmstart.warm_start_dir(NAME).parent
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []
