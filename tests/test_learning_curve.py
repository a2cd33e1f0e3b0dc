"""The learning-curve benchmark end to end at its smoke size: a tiny policy, one step of GRPO and of TASPO on
one ALFWorld game, evaluated at steps 0 and 1; its JSON report and figure."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # about 25 s: the benchmark script end to end
def test_smoke_setting_writes_curves_and_figure(tmp_path, tiny_model_dir, one_torch_thread):
    main = runpy.run_path(str(ROOT / "benchmarks" / "learning_curve.py"), run_name="learning_curve")["main"]
    report = main(["--setting", "smoke", "--model", tiny_model_dir, "--out", str(tmp_path)])

    assert json.loads((tmp_path / "learning_curve.json").read_text()) == report
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["setting"] == "smoke" and report["eval_games"] == 1
    assert set(report["methods"]) == {"grpo", "taspo"}
    for curves in report["methods"].values():
        points = curves["seeds"]["0"]
        assert [p["step"] for p in points] == [0, 1]
        for point in points:
            assert 0.0 <= point["success"] <= 1.0 and 0.0 <= point["valid_action_rate"] <= 1.0
            assert set(point["success_per_family"]) == {"pick_and_place_simple"}
        assert curves["mean"] == [
            {"step": p["step"], "success": p["success"], "valid_action_rate": p["valid_action_rate"]} for p in points
        ]
    # Same starting policy, same games, same evaluation seed: step 0 is one measurement, whatever the method.
    grpo, taspo = (report["methods"][m]["seeds"]["0"][0] for m in ("grpo", "taspo"))
    assert {k: v for k, v in grpo.items() if k != "eval_seconds"} == {k: v for k, v in taspo.items() if k != "eval_seconds"}
