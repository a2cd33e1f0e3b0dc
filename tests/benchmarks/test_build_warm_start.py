"""``benchmarks/build_warm_start.py --check``: the rebuilt adapter is compared tensor by tensor with the shipped one,
relative to each shipped tensor's largest entry, a rebuild on other training data fails, and the result is recorded
beside the build's timing for the results page. The training itself is replaced by a writer of a small adapter."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture
def script(load_benchmark, tmp_path, monkeypatch):
    module = load_benchmark("build_warm_start")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    save_file({"a": torch.tensor([[1.0, -2.0]]), "b": torch.tensor([4.0, 0.5])}, str(shipped / "adapter_model.safetensors"))
    (shipped / "warm_start.json").write_text(json.dumps({"data_sha256": "rows-1"}))
    timing = tmp_path / "warm_start_build.json"
    timing.write_text(json.dumps({"name": module.NAME, "build_seconds": 6000.0}))
    monkeypatch.setattr(module, "shipped_warm_start_dir", lambda name: shipped)
    monkeypatch.setattr(module, "TIMING", timing)
    module.rebuilt = {"a": torch.tensor([[1.0, -2.0]]), "b": torch.tensor([4.0, 0.5])}
    module.rebuilt_rows = "rows-1"

    def fake_build(name, out, bf16):
        out.mkdir(parents=True, exist_ok=True)
        save_file(module.rebuilt, str(out / "adapter_model.safetensors"))
        return {"build_seconds": 12.0, "data_sha256": module.rebuilt_rows,
                "built_with": {"bf16": False, "torch_threads": 2, "versions": {}}}

    monkeypatch.setattr(module, "build", fake_build)
    return module, timing


def _check(module, monkeypatch, *extra):
    monkeypatch.setattr(sys, "argv", ["build_warm_start.py", "--check", *extra])
    module.main()


def test_an_identical_rebuild_passes_and_is_recorded_beside_the_build(script, monkeypatch, capsys):
    module, timing = script
    _check(module, monkeypatch)
    assert "largest relative difference from the shipped adapter 0 " in capsys.readouterr().out
    record = json.loads(timing.read_text())
    assert record["build_seconds"] == 6000.0  # the build's own timing stays
    assert record["check"]["largest_relative_difference"] == 0.0 and record["check"]["same_data"] is True
    assert record["check"]["rebuild_seconds"] == 12.0 and "provenance" in record["check"]


def test_a_difference_is_relative_to_the_shipped_tensors_largest_entry(script, monkeypatch):
    module, timing = script
    module.rebuilt = {"a": torch.tensor([[1.0, -2.5]]), "b": torch.tensor([4.0, 0.5])}  # 0.5 off an entry of 2
    with pytest.raises(SystemExit) as failed:
        _check(module, monkeypatch)
    assert failed.value.code == 1
    assert json.loads(timing.read_text())["check"]["largest_relative_difference"] == pytest.approx(0.25)
    _check(module, monkeypatch, "--tolerance", "0.3")  # within a stated tolerance it passes


def test_a_rebuild_on_other_training_data_fails_even_with_equal_weights(script, monkeypatch, capsys):
    module, timing = script
    module.rebuilt_rows = "rows-2"
    with pytest.raises(SystemExit):
        _check(module, monkeypatch, "--tolerance", "1")
    assert "training data OTHER than the shipped build's" in capsys.readouterr().out
    assert json.loads(timing.read_text())["check"]["same_data"] is False
