"""The learning-curve benchmark: its statistics against hand-computed numbers and properties, the part checks, and
the smoke setting end to end (a tiny policy, GRPO and TASPO on one fresh ALFWorld game, evaluated at steps 0, 1
and 2; about 15 s), stopped after its first evaluation and resumed from that checkpoint."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def curve() -> dict:
    return runpy.run_path(str(ROOT / "benchmarks" / "learning_curve.py"), run_name="learning_curve")


def test_area_under_curve_is_the_trapezoid_mean_over_the_evaluated_steps(curve):
    # one seed, two games, steps 0, 10, 40: game 1 lost, won, won; game 2 won, lost, lost
    outcomes = np.array([[[0, 1]], [[1, 0]], [[1, 0]]])
    # game 1: (10 * 0.5 + 30 * 1) / 40 = 0.875; game 2: (10 * 0.5 + 30 * 0) / 40 = 0.125
    assert curve["area_under_curve"]([0, 10, 40], outcomes).tolist() == [[0.875, 0.125]]


def test_bootstrap_of_one_seed_and_two_games_spans_both_ends(curve):
    # resampled means of games (1, 0) are 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4: the 2.5 % and 97.5 %
    # percentiles are 0 and 1
    interval = curve["bootstrap_mean"](np.array([[1, 0]]), resamples=2000)
    assert interval == {"mean": 0.5, "low": 0.0, "high": 1.0}


def test_detectable_difference_scales_the_bootstrap_error_of_seed_pairs(curve):
    # one pair of seeds differing by (1, -1, 0, 0) over four games: population variance 0.5, so the bootstrap's
    # standard error of the mean is sqrt(0.5 / 4); with 3 seeds it shrinks by sqrt(1 / 3); 2.8 of them: 0.5716
    detectable = curve["detectable_difference"]([np.array([1, -1, 0, 0])], seeds=3, resamples=20000)
    assert detectable == pytest.approx(2.8 * np.sqrt(0.5 / 4) * np.sqrt(1 / 3), rel=0.03)
    assert curve["detectable_difference"]([], seeds=3) is None


outcome_arrays = st.integers(1, 3).flatmap(lambda seeds: st.integers(1, 6).flatmap(
    lambda games: st.lists(st.lists(st.integers(0, 1), min_size=games, max_size=games), min_size=seeds,
                           max_size=seeds)))


@settings(max_examples=40, deadline=None)
@given(outcome_arrays, outcome_arrays)
def test_paired_difference_is_antisymmetric_and_its_interval_holds_its_mean(curve, a, b):
    a = np.array(a)
    b = np.resize(np.array(b), a.shape)
    forward = curve["paired_difference"](a, b, resamples=200)
    backward = curve["paired_difference"](b, a, resamples=200)
    assert forward["mean"] == pytest.approx(-backward["mean"])
    assert (forward["low"], forward["high"]) == pytest.approx((-backward["high"], -backward["low"]))
    assert -1.0 <= forward["low"] <= forward["high"] <= 1.0
    assert curve["paired_difference"](a, a, resamples=200) == {"mean": 0.0, "low": 0.0, "high": 0.0}


def _run(method: str, seed: int, steps: dict[int, list[int]], done: bool = True) -> dict:
    return {"method": method, "seed": seed, "done": done, "segments": [],
            "points": [{"step": step, "outcomes": outcomes, "success": float(np.mean(outcomes))}
                       for step, outcomes in steps.items()]}


def test_statistics_pair_each_method_with_grpo_on_the_finished_seeds(curve):
    runs = [
        _run("grpo", 0, {0: [1, 0, 0, 0], 10: [1, 0, 0, 0], 20: [1, 1, 0, 0]}),
        _run("grpo", 1, {0: [1, 0, 0, 0], 10: [0, 0, 0, 0], 20: [1, 0, 0, 0]}),
        _run("taspo", 0, {0: [1, 0, 0, 0], 10: [1, 1, 0, 0], 20: [1, 1, 1, 1]}),
        _run("taspo", 1, {0: [1, 0, 0, 0], 10: [1, 1, 1, 0]}, done=False),  # stopped after step 10: left out
    ]
    stats = curve["curve_statistics"](runs, full_seeds=3, resamples=500)
    assert stats["methods"]["taspo"]["steps"] == [0, 10, 20]
    assert stats["methods"]["taspo"]["success"][-1]["seeds"] == 1
    assert [row["mean"] for row in stats["methods"]["grpo"]["success"]] == [0.25, 0.125, 0.375]
    # GRPO from step 0 to 20: seed 0 gains game 2, seed 1 nothing: (1 + 0) / 8
    assert stats["methods"]["grpo"]["change"]["mean"] == pytest.approx(0.125)
    assert stats["methods"]["grpo"]["change"]["from_step"] == 0 and stats["methods"]["grpo"]["change"]["to_step"] == 20
    against = stats["methods"]["taspo"]["against_grpo"]
    assert against["seeds"] == [0] and against["last_step"] == 20
    # step 20, seed 0: TASPO 4/4, GRPO 2/4
    assert against["last"]["mean"] == pytest.approx(0.5)
    # area over steps 0, 10, 20 per game (trapezoids of width 10 over 20): TASPO 1, 0.75, 0.25, 0.25 (mean
    # 0.5625); GRPO 1, 0.25, 0, 0 (mean 0.3125)
    assert against["auc"]["mean"] == pytest.approx(0.25)
    assert against["last"]["verdict"] in ("better than GRPO", "no detectable difference")
    # seed pairs come from GRPO alone (one finished TASPO seed): at step 20 the seeds differ by (0, 1, 0, 0)
    detectable = stats["detectable_difference"]
    assert detectable["seed_pairs"] == 1
    expected = curve["detectable_difference"]([np.array([0, 1, 0, 0])], seeds=3, resamples=500)
    assert detectable["last"] == expected


def _identity(curve, **changes) -> dict:
    base = {"setting": "smoke", "config": {"steps": 2, "eval_every": 1}, "warm_start": {"name": "m"},
            "code_sha256": "abc", "versions": {"torch": "2"}, "bf16": False, "eval_games_sha256": "g",
            "eval_games": 2, "eval_seed": 0}
    for key, value in changes.items():
        base[key] = value
    return base


def test_a_part_refuses_an_invocation_with_other_settings_or_code_and_names_them(curve, tmp_path):
    curve["open_part"](tmp_path, _identity(curve), {"command": "first"})
    curve["open_part"](tmp_path, _identity(curve), {"command": "again"})
    assert [i["command"] for i in json.loads((tmp_path / "part.json").read_text())["invocations"]] == ["first", "again"]
    with pytest.raises(curve["PartMismatch"], match=r'code_sha256: "abc" vs "def"; config\.steps: 2 vs 3'):
        curve["open_part"](tmp_path, _identity(curve, config={"steps": 3, "eval_every": 1}, code_sha256="def"), None)


def test_merge_pools_parts_of_one_identity_and_refuses_others(curve, tmp_path):
    def part(name: str, runs: list[dict], **changes) -> Path:
        folder = tmp_path / name
        curve["open_part"](folder, _identity(curve, **changes), {"command": name})
        for run in runs:
            curve["write_json"](folder / "runs" / f"{run['method']}_seed{run['seed']}.json", run)
        return folder

    a = part("a", [_run("grpo", 0, {0: [1, 0], 1: [1, 1]})])
    b = part("b", [_run("taspo", 0, {0: [1, 0], 1: [0, 0]}), _run("grpo", 0, {0: [1, 0], 1: [1, 1]})])
    merged = curve["merge_parts"]([a, b], tmp_path / "merged")
    assert [i["command"] for i in merged["invocations"]] == ["a", "b"]
    assert sorted(p.name for p in (tmp_path / "merged" / "runs").iterdir()) == ["grpo_seed0.json", "taspo_seed0.json"]
    # a merge's report is a part too (the committed results file): merging it with another part
    report = curve["write_report"](tmp_path / "merged", resamples=50)
    (tmp_path / "report.json").write_text(json.dumps(report))
    c = part("c", [_run("taspo", 1, {0: [1, 0], 1: [1, 0]})])
    again = curve["merge_parts"]([tmp_path / "report.json", c], tmp_path / "merged_again")
    assert [i["command"] for i in again["invocations"]] == ["a", "b", "c"]
    assert sorted(p.name for p in (tmp_path / "merged_again" / "runs").iterdir()) == [
        "grpo_seed0.json", "taspo_seed0.json", "taspo_seed1.json"]
    other = part("other", [], warm_start={"name": "another"})
    with pytest.raises(curve["PartMismatch"], match=r'warm_start\.name: "m" vs "another"'):
        curve["merge_parts"]([a, other], tmp_path / "merged2")
    clash = part("clash", [_run("grpo", 0, {0: [1, 0], 1: [0, 0]})])
    with pytest.raises(curve["PartMismatch"], match="grpo seed 0 is in"):
        curve["merge_parts"]([a, clash], tmp_path / "merged3")


class _StopAfterFirstSave(Exception):
    pass


def test_smoke_setting_stops_resumes_from_its_last_evaluation_and_reports(curve, tmp_path, tiny_model_dir,
                                                                         one_torch_thread):
    from transformers import TrainerCallback

    main, build_trainer = curve["main"], curve["build_trainer"]

    class StopAfterFirstSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 1:
                raise _StopAfterFirstSave

    def build_and_stop(argv, callbacks, model_override):
        return build_trainer(argv, callbacks=[*callbacks, StopAfterFirstSave()], model_override=model_override)

    argv = ["--setting", "smoke", "--model", tiny_model_dir, "--out", str(tmp_path), "--methods", "grpo"]
    main.__globals__["build_trainer"] = build_and_stop
    try:
        with pytest.raises(_StopAfterFirstSave):
            main(argv)
    finally:
        main.__globals__["build_trainer"] = build_trainer
    stopped = json.loads((tmp_path / "runs" / "grpo_seed0.json").read_text())
    assert [p["step"] for p in stopped["points"]] == [0, 1] and not stopped["done"]
    assert (tmp_path / "train" / "grpo_seed0" / "checkpoint-1" / "_save_complete.json").is_file()

    # As if the run had gone on to evaluate step 2 and was killed while saving its checkpoint: the cut-off
    # checkpoint is passed over for checkpoint-1, and step 2's evaluation, which has no checkpoint, is redone.
    cut_off = tmp_path / "train" / "grpo_seed0" / "checkpoint-2"
    cut_off.mkdir()
    (cut_off / "_save_started.json").write_text("{}")
    (cut_off / "model.safetensors").write_bytes(b"\x00" * 16)
    unsaved = {**stopped["points"][1], "step": 2, "eval_seconds": -1.0}
    curve["write_json"](tmp_path / "runs" / "grpo_seed0.json", {**stopped, "points": [*stopped["points"], unsaved]})
    steps_taken = []

    class CountSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps_taken.append((Path(args.output_dir).name, state.global_step))

    main.__globals__["build_trainer"] = lambda argv, callbacks, model_override: build_trainer(
        argv, callbacks=[*callbacks, CountSteps()], model_override=model_override)
    try:
        report = main([*argv, "taspo"])  # GRPO resumes at step 1, TASPO starts
    finally:
        main.__globals__["build_trainer"] = build_trainer
    assert steps_taken == [("grpo_seed0", 2), ("taspo_seed0", 1), ("taspo_seed0", 2)]  # GRPO's step 1 not redone
    assert json.loads((tmp_path / "learning_curve.json").read_text()) == report
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = {run["method"]: run for run in report["runs"]}
    grpo = runs["grpo"]
    assert [p["step"] for p in grpo["points"]] == [0, 1, 2] and grpo["done"]
    assert grpo["points"][:2] == stopped["points"]  # the evaluations before the stop are kept, not redone
    assert grpo["points"][2]["eval_seconds"] >= 0  # step 2 evaluated again, after training it again
    assert [(s["from_step"], s["to_step"]) for s in grpo["segments"]] == [(0, 1), (1, 2)]
    state = json.loads((tmp_path / "train" / "grpo_seed0" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert not (tmp_path / "train" / "grpo_seed0" / "checkpoint-1").exists()  # the last checkpoint kept
    assert report["identity"]["eval_games"] == 2 and len(report["invocations"]) == 2
    for run in runs.values():
        for point in run["points"]:
            assert len(point["outcomes"]) == 2 and point["success"] == sum(point["outcomes"]) / 2
    assert runs["taspo"]["points"][0] == grpo["points"][0]  # one policy at step 0: measured once
    assert set(report["methods"]) == {"grpo", "taspo"}
    assert report["methods"]["taspo"]["against_grpo"]["last_step"] == 2

    again = main([*argv, "taspo"])  # finished: nothing is trained again
    assert again["runs"] == report["runs"]


def test_a_pilot_sized_run_trains_its_own_steps_and_its_part_refuses_the_settings_size(
        curve, tmp_path, tiny_model_dir, one_torch_thread):
    main = curve["main"]
    argv = ["--setting", "smoke", "--model", tiny_model_dir, "--out", str(tmp_path), "--methods", "grpo"]
    report = main([*argv, "--steps", "1", "--eval-every", "1"])
    (run,) = report["runs"]
    assert [p["step"] for p in run["points"]] == [0, 1] and run["done"]
    assert report["identity"]["config"]["steps"] == 1
    with pytest.raises(SystemExit, match="config.steps: 1 vs 2"):
        main(argv)  # the smoke setting's own 2 steps: another identity
    with pytest.raises(SystemExit):
        main([*argv, "--steps", "0"])


def test_the_evaluation_decodes_at_the_settings_temperature_else_the_trainings(curve):
    from types import SimpleNamespace

    args = SimpleNamespace(layout="turn", history_window=1, max_prompt_tokens=2048, max_completion_length=48,
                           temperature=1.0, top_p=1.0, bf16=False, environment="alfworld")
    for fixed, expected in ((0.0, 0.0), (None, 1.0)):
        recorder = curve["CurveRecorder"]([{}], max_turns=2, every=1, on_point=None, start=1, temperature=fixed)
        recorder.on_train_begin(args, None, None)  # start 1: nothing evaluated at step 0
        assert recorder.eval_args.temperature == expected
    assert curve["SETTINGS"]["cpu"].eval_temperature == 0.0  # greedy: no sampling noise in the paired differences
