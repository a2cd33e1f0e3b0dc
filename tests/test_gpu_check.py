"""The GPU check's CPU dry run (tiny model, float32, no DeepSpeed), so benchmarks/gpu_check.py keeps working
between the rare tasks that are lent a GPU: every mode and method trains, and its report is sane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


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
