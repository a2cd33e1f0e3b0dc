"""A smoke run of ``benchmarks/credit_quality.py`` with a tiny random policy: one game, mixed siblings (two planned
wins, two sampled), GRPO and GiGPO only (no teacher pass). It checks the wiring, not the figures."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def credit_quality(load_benchmark):
    return load_benchmark("credit_quality")


@pytest.mark.slow  # about 90 s on 2 cores; the labelling and AUC tests cover the pieces in the default run
def test_mixed_siblings_smoke(credit_quality, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    results = credit_quality.main([
        "--model", tiny_model_dir, "--siblings", "mixed", "--task-types", "pick_and_place_simple",
        "--methods", "gigpo", "--max-turns", "3", "--max-completion-length", "8", "--out", str(out),
        "--batches", "1", "--resamples", "50",
    ])
    assert json.loads((out / "credit_quality.json").read_text()) == json.loads(json.dumps(results))
    assert (out / "credit_quality.png").stat().st_size > 0
    trajectories = results["trajectories"]
    assert [t["planned"] for t in trajectories] == [True, True, False, False]
    # the first planned sibling is the walkthrough: every action makes progress and it ends at the goal
    assert trajectories[0]["won"] and trajectories[0]["distances"][-1] == 0
    assert all(trajectories[0]["progress"])
    # the random policy's sampled siblings fail; whatever they sent, their labels come from their own replay
    assert not trajectories[2]["won"] and len(trajectories[2]["progress"]) == len(trajectories[2]["commands"])
    grpo = results["methods"]["grpo"]["scores"]
    # GRPO's weights are all 1, so every (progress, other) pair is a tie; the detour's "look" is the one other action
    assert grpo["success"]["auc"] == 0.5 and grpo["success"]["other_actions"] == 1
    assert grpo["failed"]["auc"] in (0.5, None)  # None when no sampled action made progress
    assert all(w == 1.0 for t in trajectories for w in t["weights"]["grpo"])
    assert set(results["methods"]) == {"grpo", "gigpo"}
    # one batch: the pooled scores are that batch's
    assert [{m: e["scores"] for m, e in results["methods"].items()}] == [b["methods"] for b in results["per_batch"]]
    # GRPO moves no weight: its interval is the point 0.5 and no trajectory's weights moved
    assert results["methods"]["grpo"]["intervals"]["success"]["auc"] == {"estimate": 0.5, "low": 0.5, "high": 0.5}
    assert results["methods"]["grpo"]["moved"]["success"] == 0.0
    assert results["bootstrap"]["resamples"] == 50 and results["precision"].startswith(("float32 (", "bf16 autocast ("))
    assert results["provenance"]["command"].startswith("python benchmarks/credit_quality.py")


@pytest.mark.slow  # about a minute each on 2 cores
@pytest.mark.parametrize("env", ["webshop", "search"])
def test_noisy_oracle_siblings_on_the_other_environments(credit_quality, tiny_model_dir, tmp_path, env):
    results = credit_quality.main(["--env", env, "--quick", "--tasks", "2", "--model", tiny_model_dir,
                                   "--methods", "gigpo", "--out", str(tmp_path)])
    assert results["settings"]["siblings"] == "scripted" and results["batch"]["trajectories"] == 8
    for trajectory in results["trajectories"]:
        assert len(trajectory["progress"]) == len(trajectory["commands"])
        if env == "webshop":  # a win ends at distance 0 of the fewest steps to the goal purchase
            assert (trajectory["distances"][-1] == 0) == trajectory["won"]
        elif trajectory["won"]:  # a right answer is the last action, and it is progress
            assert trajectory["progress"][-1] is True
    assert set(results["methods"]["gigpo"]["intervals"]["failed"]) == {"auc", "minus_grpo"}


class _TeacherPass:
    """A trainer's teacher pass reduced to what the benchmark's memo sees: it counts its passes, and each score
    names the context it was taken under."""

    def __init__(self) -> None:
        self.passes = 0

    def _teacher_scores(self, trajectories, contexts):
        self.passes += 1
        return dict(contexts)


def test_methods_share_a_teacher_pass_only_under_identical_contexts(credit_quality):
    memo: dict = {}
    first, second = _TeacherPass(), _TeacherPass()
    credit_quality._shared_teacher_scores(first, memo)
    credit_quality._shared_teacher_scores(second, memo)
    skills = {(0, 0): "[Skills] heat it", (0, 1): "[Skills] heat it"}
    guidance = {(0, 0): "[Privileged Guidance] go to", (0, 1): "[Privileged Guidance] go to"}
    assert first._teacher_scores([], skills) == skills and first.passes == 1
    assert second._teacher_scores([], skills) == skills and second.passes == 0  # the same contexts: shared
    assert second._teacher_scores([], guidance) == guidance and second.passes == 1  # same turns, other contexts
