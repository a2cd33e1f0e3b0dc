"""``benchmarks/quickstart_time.py``: a smoke run of the whole command with a tiny random policy (wiring, not
figures): it writes the JSON the results page renders, with the step lines the run printed."""

from __future__ import annotations

import json

import pytest


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


@pytest.mark.parametrize("extra, cpu_bf16, want", [
    (["--bf16", "false"], "1", False),
    (["--bf16=true"], "0", True),
    (["--bf16", "--max_steps", "1"], "0", True),  # bare, as taspo-train's parser reads it
    (["--max_steps", "1", "--bf16"], "0", True),
    (["--max_steps", "1"], "1", True),  # not asked: what the CPU computes
    (["--max_steps", "1"], "0", False),
])
def test_the_timed_matmul_uses_the_runs_precision(load_benchmark, monkeypatch, extra, cpu_bf16, want):
    monkeypatch.setenv("TASPO_TRL_CPU_BF16", cpu_bf16)
    assert load_benchmark("quickstart_time").run_precision(extra).bf16 is want
