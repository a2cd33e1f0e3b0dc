"""``benchmarks/decode_pace.py``: a smoke run with a tiny random policy (wiring, not figures): both samplers run on
the same prompts, sample the same tokens once today's draws as ``generate`` draws, and the limit and the measurements land in the JSON."""

from __future__ import annotations

import json

import taspo_trl.rollout.generation as generation


def test_the_sampler_before_and_after_are_timed_against_the_limit(load_benchmark, tmp_path, tiny_model_dir):
    decode_pace = load_benchmark("decode_pace")
    out = tmp_path / "decode_pace.json"
    cache, draw = generation.growing_cache, generation.sample_rows
    decode_pace.main(["--model", tiny_model_dir, "--batch", "3", "--prompt-tokens", "20", "--new-tokens", "16",
                      "--reps", "1", "--read-gib", "0.01", "--bf16", "true", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["precision"] == "bf16 autocast" and result["same_samples_with_generates_draw"] is True
    assert result["weight_read_limit_ms"] > 0 and result["read_bandwidth_gb_s"] > 0
    assert set(result["before"]) == set(result["after"]) >= {"decode_ms_per_step", "times_the_limit"}
    assert len(result["after"]["decode_ms_all"]) == 1  # the warm-up round is not kept
    shares = result["decode_op_shares"]  # where a decode step's operator time goes
    assert set(shares) == {"linear layers", "attention", "other"} and abs(sum(shares.values()) - 1) < 0.01
    assert shares["linear layers"] > 0 and shares["attention"] > 0
    assert generation.growing_cache is cache and generation.sample_rows is draw  # both samplers are put back
    assert result["provenance"]["command"].startswith("python benchmarks/decode_pace.py --model")


def test_a_lora_model_samples_the_same_tokens_with_and_without_the_fused_step(load_benchmark, tmp_path,
                                                                              tiny_model_dir):
    decode_pace = load_benchmark("decode_pace")
    out = tmp_path / "decode_pace_lora.json"
    decode_pace.main(["--model", tiny_model_dir, "--batch", "3", "--prompt-tokens", "20", "--new-tokens", "16",
                      "--reps", "1", "--read-gib", "0.01", "--bf16", "true", "--lora-rank", "4", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["settings"]["lora_rank"] == 4
    assert result["same_samples_with_and_without_the_fused_step"] is True
    assert result["same_samples_with_generates_draw"] is True
