"""The GPU check's CPU dry run (tiny model, float32, no DeepSpeed), so benchmarks/gpu_check.py keeps working
between the rare tasks that are lent a GPU: every mode and method trains, and its report is sane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow  # about a minute: the whole GPU check script on the CPU; the trainer tests cover its parts
def test_dry_run_reports_sane_figures(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--steps", "1", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["precision"] == "float32" and set(report["modes"]) == {"plain", "repeat"}
    for name, mode in report["modes"].items():
        assert set(mode) == {"grpo", "taspo", "alignopsd"}, mode.get("error", "")[-2000:]
        for result in mode.values():
            assert len(result["step_times"]) == 1 and result["step_times"][0] > 0
            # float32 on the CPU: the trainer's padded recompute matches the per-trajectory scoring
            assert result["logprob_max_abs_diff"] < 1e-3
        ratios = report["ratios"][name]
        assert ratios["taspo/grpo"] > 0 and ratios["alignopsd/grpo"] > 0
        for method in ("taspo", "alignopsd"):
            step_weights = mode[method]["weights"][0]
            assert len(step_weights) == 4 and any(w != 1.0 for traj in step_weights for w in traj), method
            assert any(mode[method]["pi"][0]), method
    comparison = report["comparisons"]["plain vs repeat"]
    for method in ("taspo", "alignopsd"):
        assert comparison[method]["pi_equal"] and comparison[method]["weights_match"], comparison
    assert "PI equal" in done.stdout


def _gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_carried_encoder_has_no_weights_and_is_rebuilt_the_same_in_every_mode(tmp_path):
    import torch
    from safetensors.torch import load_file

    from taspo_trl.privileged.encoder import get_encoder

    check = _gpu_check()
    check.export_assets(tmp_path / "assets")
    carried = tmp_path / "assets" / "encoder"
    assert not list(carried.rglob("*.safetensors")) and not list(carried.rglob("*.bin"))
    assert sum(f.stat().st_size for f in (tmp_path / "assets").rglob("*") if f.is_file()) < 8 * 2**20
    first = check.random_encoder(carried, tmp_path / "first")
    second = check.random_encoder(carried, tmp_path / "second")
    a, b = load_file(Path(first) / "model.safetensors"), load_file(Path(second) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(t.dtype == torch.float32 for t in a.values())
    encoder = get_encoder(first)
    texts = ["Step 1: I will do the next step.", "Step 1: I will do the next step.", "go to drawer 1"]
    vectors = torch.as_tensor(encoder.encode(texts))
    assert vectors.shape == (3, 384)
    assert torch.nn.functional.cosine_similarity(vectors[0], vectors[1], dim=0) > 0.9999


def test_only_the_first_step_judges_the_weights_later_steps_are_reported():
    check = _gpu_check()

    def run(first, later):
        entry = {"pi": [["pi"], ["pi"]], "weights": [[[1.0, first]], [[1.0, later]]]}
        return {"taspo": entry, "alignopsd": entry}

    # The first step scores one policy in both runs; after an update they train different ones.
    same_start = check.compare_runs(run(0.90, 0.70), run(0.95, 0.90), tolerance=0.1)["alignopsd"]
    assert same_start["weights_match"] and same_start["max_weight_diff"] == pytest.approx(0.05)
    assert same_start["max_weight_diff_later_steps"] == pytest.approx(0.20)
    wrong_start = check.compare_runs(run(0.70, 0.70), run(0.95, 0.70), tolerance=0.1)["taspo"]
    assert not wrong_start["weights_match"] and wrong_start["max_weight_diff"] == pytest.approx(0.25)
