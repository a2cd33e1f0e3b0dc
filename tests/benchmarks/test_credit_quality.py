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
    assert results["bootstrap"]["resamples"] == 50 and results["precision"] in ("float32", "bf16 autocast")
    [why] = results["precision_reasons"]  # one run: one reason, for its one batch and the method it scored
    assert why["seeds"] == [0] and why["methods"] == ["gigpo"] and why["reason"]
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


def _run_file(path, seed, trajectories, *, method="taspo", precision=("float32", "auto"), fingerprint="abc",
              **settings):
    """A result file of one batch (``seed``) holding ``trajectories`` (group, won, ``method``'s weights, labels),
    scored by GRPO and ``method``, in ``precision`` (the precision, why it was chosen)."""
    records = [
        {"game": f"task-{g}", "group": [0, g], "won": won, "advantage": 1.0 if won else -1.0, "progress": labels,
         "commands": ["look"] * len(labels), "weights": {"grpo": [1.0] * len(labels), method: weights}}
        for g, won, weights, labels in trajectories
    ]
    run = {
        "settings": {"env": "search", "model": "embedded", "siblings": "scripted", "methods": ["grpo", method],
                     "seed": seed, "batches": 1, "tasks": 2, "out": str(path.parent), **settings},
        "precision": precision[0], "precision_reasons": [{"reason": precision[1], "seeds": [seed], "methods": [method]}],
        "warm_start_fingerprint": fingerprint,
        "seconds": [{"rollout_and_grpo": 1.0, method: 2.0}], "methods": {"grpo": {}, method: {}},
        "per_batch": [{"seed": seed, "trajectories": len(records), "methods": {"grpo": {"auc": 0.5}, method: {"auc": 0.7}}}],
        "trajectories": records,
        "provenance": {"commit": "c0ffee", "command": "python benchmarks/credit_quality.py"},
    }
    path.write_text(json.dumps(run))
    return path


def test_merge_pools_the_batches_of_two_runs_by_hand(credit_quality, tmp_path):
    # Seed 1's run is given first: the merge orders the runs by seed and renumbers their batches 0, 1.
    late = _run_file(tmp_path / "b.json", 1, [(0, True, [0.7, 1.3], [False, True]), (1, False, [0.5], [True])])
    early = _run_file(tmp_path / "a.json", 0, [(0, True, [1.2, 0.8], [True, False]), (0, False, [0.9, 1.1], [True, False])])
    results = credit_quality.main(["--merge", str(late), str(early), "--out", str(tmp_path / "out"), "--resamples", "50"])
    assert [t["group"] for t in results["trajectories"]] == [[0, 0], [0, 0], [1, 0], [1, 1]]
    assert [b["seed"] for b in results["per_batch"]] == [0, 1] and results["settings"]["batches"] == 2
    taspo = results["methods"]["taspo"]["scores"]
    # Won side: progress weights {1.2, 1.3}, other {0.8, 0.7}: every pair ordered the right way.
    assert taspo["success"]["auc"] == 1.0 and taspo["success"]["progress_actions"] == 2
    # Failed side: progress {0.9, 0.5} against other {1.1}: both below, AUC 0.
    assert taspo["failed"]["auc"] == 0.0 and taspo["failed"]["other_actions"] == 1
    assert results["batch"] == {"trajectories": 4, "won": 2, "nonzero_advantage": 4,
                                "success_progress_fraction": 0.5, "failed_progress_fraction": 2 / 3}
    assert [m["commit"] for m in results["provenance"]["merged_from"]] == ["c0ffee", "c0ffee"]
    assert json.loads((tmp_path / "out" / "credit_quality.json").read_text())["methods"]["taspo"]["scores"] == taspo


@pytest.mark.parametrize("change, message", [
    ({"seed": 0}, "seed 0 is scored by \[.taspo.\] in both"),
    ({"tasks": 3}, "tasks=3"),
    ({"precision": ("bf16 autocast", "auto")}, "ran in bf16 autocast"),
    ({"fingerprint": "def"}, "different warm starts"),
])
def test_merge_refuses_runs_that_are_not_parts_of_one_setting(credit_quality, tmp_path, change, message):
    one = [(0, True, [1.0], [True])]
    first = _run_file(tmp_path / "a.json", 0, one)
    seed = change.pop("seed", 1)
    second = _run_file(tmp_path / "b.json", seed, one, **change)
    with pytest.raises(SystemExit, match=message):
        credit_quality.main(["--merge", str(first), str(second), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # nothing written


def test_merge_keeps_each_parts_reason_for_its_precision(credit_quality, tmp_path):
    # float32 chosen automatically on a CPU without bf16 instructions (seeds 0, 1) and by --no-bf16 on one with them
    # (seed 2): one precision, pooled, with both reasons kept and the seeds each covers.
    one = [(0, True, [1.0], [True])]
    auto, forced = ("float32", "auto: no bf16 here"), ("float32", "set by bf16: false")
    parts = [_run_file(tmp_path / f"{seed}.json", seed, one, precision=precision)
             for seed, precision in ((0, auto), (2, forced), (1, auto))]
    merged = credit_quality.main(["--merge", *map(str, parts), "--out", str(tmp_path / "m"), "--resamples", "20"])
    assert merged["precision"] == "float32"
    assert merged["precision_reasons"] == [{"reason": "auto: no bf16 here", "seeds": [0, 1], "methods": ["taspo"]},
                                           {"reason": "set by bf16: false", "seeds": [2], "methods": ["taspo"]}]
    # merged again with another automatic part, the reasons are read back and the seeds regrouped
    later = _run_file(tmp_path / "4.json", 4, one, precision=auto)
    again = credit_quality.main(["--merge", str(tmp_path / "m" / "credit_quality.json"), str(later),
                                 "--out", str(tmp_path / "m2"), "--resamples", "20"])
    assert [(p["reason"], p["seeds"]) for p in again["precision_reasons"]] == [("auto: no bf16 here", [0, 1, 4]),
                                                                              ("set by bf16: false", [2])]
    # parts that agree keep one reason
    same = credit_quality.main(["--merge", str(parts[0]), str(parts[2]), "--out", str(tmp_path / "m3"),
                                "--resamples", "20"])
    assert same["precision_reasons"] == [{"reason": "auto: no bf16 here", "seeds": [0, 1], "methods": ["taspo"]}]
    # other methods scored on the same seeds for another reason: each reason keeps its methods
    taspo = [_run_file(tmp_path / f"t{seed}.json", seed, one, precision=auto) for seed in (0, 1)]
    gigpo = [_run_file(tmp_path / f"g{seed}.json", seed, one, method="gigpo", precision=forced) for seed in (0, 1)]
    joined = credit_quality.main(["--merge", *map(str, taspo + gigpo), "--out", str(tmp_path / "m5"), "--resamples", "20"])
    assert joined["precision_reasons"] == [{"reason": "auto: no bf16 here", "seeds": [0, 1], "methods": ["taspo"]},
                                           {"reason": "set by bf16: false", "seeds": [0, 1], "methods": ["gigpo"]}]


def test_merge_joins_other_methods_scored_on_the_same_batch(credit_quality, tmp_path):
    played = [(0, True, [1.2, 0.8], [True, False]), (0, False, [0.9, 1.1], [True, False])]
    taspo = _run_file(tmp_path / "a.json", 0, played)
    gigpo = _run_file(tmp_path / "b.json", 0, [(0, True, [0.8, 1.2], [True, False]), (0, False, [1.0, 1.0], [True, False])],
                      method="gigpo")
    results = credit_quality.main(["--merge", str(gigpo), str(taspo), "--out", str(tmp_path / "out"), "--resamples", "50"])
    assert list(results["methods"]) == ["grpo", "taspo", "gigpo"] == results["settings"]["methods"]
    assert results["batch"]["trajectories"] == 2 and len(results["per_batch"]) == 1
    assert set(results["per_batch"][0]["methods"]) == {"grpo", "taspo", "gigpo"}
    # Won side: TASPO ranks the progress action first (1.2 > 0.8), GiGPO last (0.8 < 1.2); failed: GiGPO ties.
    assert results["methods"]["taspo"]["scores"]["success"]["auc"] == 1.0
    assert results["methods"]["gigpo"]["scores"]["success"]["auc"] == 0.0
    assert results["methods"]["gigpo"]["scores"]["failed"]["auc"] == 0.5
    assert results["trajectories"][0]["weights"] == {"grpo": [1.0, 1.0], "taspo": [1.2, 0.8], "gigpo": [0.8, 1.2]}


def test_merge_joins_a_batch_played_at_another_place_in_another_run(credit_quality, tmp_path):
    # Seed 1 is the second batch (group [1, g]) of a two-batch TASPO run and the only batch ([0, g]) of a GiGPO run.
    seed_0 = [(0, True, [1.2, 0.8], [True, False])]
    seed_1 = [(0, False, [0.9, 1.1], [True, False])]
    both = json.loads(_run_file(tmp_path / "a.json", 0, seed_0).read_text())
    second = json.loads(_run_file(tmp_path / "b.json", 1, seed_1).read_text())
    both["per_batch"] += second["per_batch"]
    both["seconds"] += second["seconds"]
    both["trajectories"] += [{**t, "group": [1, t["group"][1]]} for t in second["trajectories"]]
    both["settings"]["batches"] = 2
    (tmp_path / "a.json").write_text(json.dumps(both))
    gigpo = [_run_file(tmp_path / f"g{seed}.json", seed, [(0, won, [1.0, 1.0], labels)], method="gigpo")
             for seed, (_, won, _, labels) in ((0, seed_0[0]), (1, seed_1[0]))]
    results = credit_quality.main(["--merge", str(tmp_path / "a.json"), *map(str, gigpo), "--out", str(tmp_path / "out"),
                                   "--resamples", "50"])
    assert [t["group"] for t in results["trajectories"]] == [[0, 0], [1, 0]]
    assert [t["weights"] for t in results["trajectories"]] == [
        {"grpo": [1.0, 1.0], "taspo": [1.2, 0.8], "gigpo": [1.0, 1.0]},
        {"grpo": [1.0, 1.0], "taspo": [0.9, 1.1], "gigpo": [1.0, 1.0]},
    ]


def test_merge_refuses_a_batch_played_differently_or_a_method_missing_from_a_batch(credit_quality, tmp_path):
    first = _run_file(tmp_path / "a.json", 0, [(0, True, [1.0], [True])])
    other_play = _run_file(tmp_path / "b.json", 0, [(0, False, [1.0], [True])], method="gigpo")
    with pytest.raises(SystemExit, match="seed 0 was played differently"):
        credit_quality.main(["--merge", str(first), str(other_play), "--out", str(tmp_path / "out")])
    other_batch = _run_file(tmp_path / "c.json", 1, [(0, True, [1.0], [True])], method="gigpo")
    with pytest.raises(SystemExit, match=r"every method must score every batch; missing \(seed, method\): \[\(0, 'gigpo'\), \(1, 'taspo'\)\]"):
        credit_quality.main(["--merge", str(first), str(other_batch), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_merge_leaves_out_a_method_rescored_by_another_run(credit_quality, tmp_path):
    played = [(0, True, [1.2, 0.8], [True, False]), (0, False, [0.9, 1.1], [True, False])]
    old = _run_file(tmp_path / "old.json", 0, played)  # TASPO ranks both sides the right way on won, wrong on failed
    rescored = _run_file(tmp_path / "new.json", 0, [(0, True, [0.8, 1.2], [True, False]), (0, False, [0.9, 1.1], [True, False])])
    out = str(tmp_path / "out")
    results = credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "taspo", "--out", out,
                                   "--resamples", "50"])
    # Only the rescored weights are pooled: the won side's progress action now weighs 0.8 against 1.2, AUC 0.
    assert results["methods"]["taspo"]["scores"]["success"]["auc"] == 0.0
    assert results["trajectories"][0]["weights"] == {"grpo": [1.0, 1.0], "taspo": [0.8, 1.2]}
    assert results["settings"]["leave_out"] == [[str(old), "taspo"]]
    with pytest.raises(SystemExit, match="other.json is not one of the --merge files"):
        credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(tmp_path / "other.json"), "taspo", "--out", out])
    with pytest.raises(SystemExit, match=r"has no gigpo scores to leave out \(it scored \['taspo'\]; GRPO always stays\)"):
        credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "gigpo", "--out", out])
    with pytest.raises(SystemExit, match="has no grpo scores"):
        credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "grpo", "--out", out])
    with pytest.raises(SystemExit):  # argparse: --leave-out without --merge
        credit_quality.main(["--leave-out", str(old), "taspo", "--out", out])


@pytest.mark.slow  # three tiny-model runs, about 3 minutes on 2 cores
def test_a_run_in_two_parts_merges_to_the_run_in_one(credit_quality, tiny_model_dir, tmp_path):
    common = ["--env", "search", "--quick", "--tasks", "2", "--model", tiny_model_dir, "--methods", "taspo",
              "--resamples", "100"]
    whole = credit_quality.main([*common, "--batches", "2", "--out", str(tmp_path / "whole")])
    parts = [credit_quality.main([*common, "--seed", str(seed), "--batches", "1", "--out", str(tmp_path / f"p{seed}")])
             for seed in (0, 1)]
    assert [p["per_batch"][0]["seed"] for p in parts] == [0, 1]
    merged = credit_quality.main(["--merge", str(tmp_path / "p1" / "credit_quality.json"),
                                  str(tmp_path / "p0" / "credit_quality.json"), "--out", str(tmp_path / "merged"),
                                  "--resamples", "100"])
    for key in ("batch", "methods", "per_batch", "trajectories", "bootstrap"):
        assert merged[key] == whole[key], key


def test_merge_leaves_out_a_methods_scores_on_some_seeds_only(credit_quality, tmp_path):
    # A two-batch file (seeds 0 and 1) whose seed-1 TASPO scores another run rescored.
    parts = [_run_file(tmp_path / f"{seed}.json", seed, [(0, True, [1.2, 0.8], [True, False])]) for seed in (0, 1)]
    credit_quality.main(["--merge", *map(str, parts), "--out", str(tmp_path / "old"), "--resamples", "20"])
    old = tmp_path / "old" / "credit_quality.json"
    rescored = _run_file(tmp_path / "new.json", 1, [(0, True, [0.7, 1.3], [True, False])])
    out = str(tmp_path / "out")
    results = credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "taspo@1",
                                   "--out", out, "--resamples", "50"])
    assert [t["weights"]["taspo"] for t in results["trajectories"]] == [[1.2, 0.8], [0.7, 1.3]]
    # Won progress weights {1.2, 0.7} against other {0.8, 1.3}: only 1.2 > 0.8 of four pairs is ordered right.
    assert results["methods"]["taspo"]["scores"]["success"]["auc"] == 0.25
    assert results["settings"]["leave_out"] == [[str(old), "taspo@1"]]
    with pytest.raises(SystemExit, match=r"played no batch with seed 3, 5 \(its seeds: 0-1\)"):
        credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "taspo@3,5", "--out", out])
    with pytest.raises(SystemExit, match="cannot read the seeds of 'taspo@one'; write METHOD@SEEDS as alignopsd@1-2"):
        credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "taspo@one", "--out", out])
    with pytest.raises(SystemExit, match=r"seed 1 is scored by \['taspo'\] in both"):  # seed 0 left out instead
        credit_quality.main(["--merge", str(old), str(rescored), "--leave-out", str(old), "taspo@0", "--out", out])
