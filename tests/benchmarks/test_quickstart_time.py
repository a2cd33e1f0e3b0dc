"""``benchmarks/quickstart_time.py``: a smoke run of the whole command with a tiny random policy (wiring, not
figures): it writes the JSON the results page renders, with the step lines the run printed."""

from __future__ import annotations

import json


def test_a_one_step_quickstart_is_timed_and_its_lines_kept(load_benchmark, tmp_path, tiny_model_dir):
    quickstart_time = load_benchmark("quickstart_time")
    out = tmp_path / "quickstart_time.json"
    quickstart_time.main(["--recipe", "alfworld_grpo_cpu", "--out", str(out), "--model_name_or_path", tiny_model_dir,
                          "--max_steps", "1", "--max_turns", "2", "--max_completion_length", "8"])
    result = json.loads(out.read_text())
    assert result["seconds"] > 0 and result["max_rss_gb"] > 0
    assert result["precision"].startswith("[taspo-train] precision: ")
    assert len(result["step_lines"]) == 1 and result["step_lines"][0].startswith("[step 1/1] reward=")
    assert result["extra_arguments"][-2:] == ["--max_completion_length", "8"]
    assert result["provenance"]["command"].startswith("python benchmarks/quickstart_time.py --recipe alfworld_grpo_cpu")
