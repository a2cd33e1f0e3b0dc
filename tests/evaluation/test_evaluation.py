"""taspo-eval: per-family statistics by hand, a scripted policy on real ALFWorld games, and end-to-end runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from taspo_trl.envs import get_env_factory
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.evaluation import EvalArguments, eval_main, evaluate_rows, summarize
from taspo_trl.models import load_model_and_tokenizer
from taspo_trl.rollout.records import Trajectory, Turn
from taspo_trl.testing import PlannedGenerator


def _trajectory(task_type: str, won: bool, turns: int, reward: float | None = None) -> Trajectory:
    turn = Turn([1], [2], [0.0], "", "a", True, "ok", (0, 1), "")
    return Trajectory({}, "t", "o", 0, task_type=task_type, turns=[turn] * turns, won=won,
                      reward=float(won) if reward is None else reward)


def test_summarize_by_hand():
    result = summarize([
        _trajectory("heat", True, 4),
        _trajectory("heat", False, 10),
        _trajectory("heat", True, 6),
        _trajectory("cool", False, 10, reward=0.25),
    ])
    heat, cool, overall = result["groups"]["heat"], result["groups"]["cool"], result["overall"]
    # Wilson 95 % intervals by hand: 2 of 3 -> centre 0.5731, half-width 0.3654; 0 of 1 -> centre 0.3967 = half-width
    assert heat == {"n": 3, "success": pytest.approx(2 / 3), "success_interval_95": pytest.approx([0.2077, 0.9385], abs=2e-4),
                    "score": pytest.approx(2 / 3), "mean_steps_success": 5.0, "errors": 0}
    assert cool == {"n": 1, "success": 0.0, "success_interval_95": pytest.approx([0.0, 0.7934], abs=2e-4),
                    "score": 0.25, "mean_steps_success": None, "errors": 0}
    assert overall["success"] == 0.5 and overall["mean_steps_success"] == 5.0
    assert overall["score"] == pytest.approx((1 + 0 + 1 + 0.25) / 4)


def test_scripted_policy_success_and_steps_on_real_games(tmp_path, tiny_model_dir):
    games = generate_games(tmp_path / "g", per_type=1, seed=0, split="eval_seen",
                           task_types=["pick_and_place_simple", "look_at_obj_in_light"])
    walkthroughs = [json.loads(Path(g).read_text())["walkthrough"] for g in games]
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    # Game 0 is played by its walkthrough (a win in len(walkthrough) steps); game 1 says "look" until the limit.
    limit = len(walkthroughs[0]) + 1
    plans = [list(walkthroughs[0]), ["look"] * limit]
    args = EvalArguments(max_turns=limit, eval_batch_size=8)
    trajectories = evaluate_rows(task_spec_rows(games), model, tokenizer, args, get_env_factory("alfworld"),
                                 generate=PlannedGenerator(model, tokenizer, plans))
    result = summarize(trajectories)
    assert result["groups"]["pick_and_place_simple"] == {
        "n": 1, "success": 1.0, "success_interval_95": pytest.approx([0.2065, 1.0], abs=2e-4), "score": 1.0,
        "mean_steps_success": float(len(walkthroughs[0])), "errors": 0}
    assert result["groups"]["look_at_obj_in_light"]["success"] == 0.0
    assert result["overall"]["success"] == 0.5


@pytest.mark.slow  # about 35 s: two CLI runs; the other evaluation tests cover evaluate_rows and the tables
def test_eval_cli_writes_a_table1_shaped_result_and_is_reproducible(tmp_path, tiny_model_dir, capsys):
    argv = ["--model_name_or_path", tiny_model_dir, "--games_root", str(tmp_path / "games"), "--games_per_type", "1",
            "--max_turns", "2", "--max_completion_length", "8", "--label", "tiny"]
    eval_main([*argv, "--results_dir", str(tmp_path / "a")])
    printed = capsys.readouterr().out
    assert "| Method | Pick (Seen) | Look (Seen) |" in printed and "All (Unseen)" in printed
    assert "Mean steps of successful episodes" in printed
    first = json.loads((tmp_path / "a" / "alfworld_eval_seen.json").read_text())
    assert first["num_tasks"] == 6 and set(first["groups"]) == {
        "pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"}
    eval_main([*argv, "--results_dir", str(tmp_path / "b"), "--splits", "eval_seen"])
    again = json.loads((tmp_path / "b" / "alfworld_eval_seen.json").read_text())
    assert again == first  # fixed tasks and sampling seed


@pytest.mark.parametrize(("environment", "header"), [("webshop", "Score"), ("search", "Avg")])
def test_eval_cli_on_webshop_and_search(tmp_path, tiny_model_dir, capsys, environment, header):
    eval_main(["--model_name_or_path", tiny_model_dir, "--environment", environment, "--max_tasks", "3",
               "--max_turns", "1", "--max_completion_length", "8", "--results_dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert header in printed and "Success rate (%)" in printed
    result_file = next(tmp_path.glob(f"{environment}_*.json"))
    result = json.loads(result_file.read_text())
    assert result["num_tasks"] == 3 and result["env"] == environment
    assert result["settings"]["max_turns"] == 1 and result["settings"]["max_completion_length"] == 8
    assert result["settings"]["top_p"] == 1.0 and result["versions"]["taspo-trl"]
    episodes = [json.loads(line) for line in result_file.with_name(result_file.stem + "_episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 3 and all(len(e["actions"]) == e["num_turns"] <= 1 for e in episodes)
    assert sum(e["won"] for e in episodes) / 3 == result["overall"]["success"]
    with open(tmp_path / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    overall = next(row for row in rows if row["group"] == "all")
    assert int(overall["n"]) == 3 and float(overall["success"]) == result["overall"]["success"]
    assert float(overall["success_low_95"]) <= float(overall["success"]) <= float(overall["success_high_95"])


def test_eval_rejects_unknown_flags(tiny_model_dir):
    with pytest.raises(SystemExit, match="unknown flag --no_such_flag"):
        eval_main(["--model_name_or_path", tiny_model_dir, "--no_such_flag", "1"])


def _skill_bank_file(path: Path) -> Path:
    """A bank with one skill for every ALFWorld task and one for heating tasks only."""
    records = [
        {"id": "any-check", "env": "alfworld", "title": "Check before leaving",
         "skill": "Look inside every opened receptacle before going elsewhere."},
        {"id": "heat-microwave", "env": "alfworld", "task_types": ["pick_heat_then_place_in_recep"],
         "title": "Heat with the microwave", "skill": "Carry the object to microwave 1 and heat it there."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_prompt_skill_bank_shows_the_task_skills_in_every_eval_prompt(tmp_path, tiny_model_dir, encoder):
    games = generate_games(tmp_path / "g", per_type=1, seed=0, split="eval_seen",
                           task_types=["pick_and_place_simple", "pick_heat_then_place_in_recep"])
    bank = _skill_bank_file(tmp_path / "skills.jsonl")
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    general = "Check before leaving: Look inside every opened receptacle before going elsewhere."
    heat = "Heat with the microwave: Carry the object to microwave 1 and heat it there."

    def prompts(**skill_args):
        args = EvalArguments(max_turns=2, max_completion_length=4, eval_batch_size=8, **skill_args)
        played = evaluate_rows(task_spec_rows(games), model, tokenizer, args, get_env_factory("alfworld"))
        return {t.task_type: [turn.prompt_text for turn in t.turns] for t in played}

    # top-2 of a bank where only the general skill applies to a pick task: that one alone; a heat task gets both.
    shown = prompts(prompt_skill_bank=str(bank), prompt_skill_top_k=2)
    assert shown["pick_and_place_simple"] and shown["pick_heat_then_place_in_recep"]
    assert all(general in p and heat not in p for p in shown["pick_and_place_simple"])
    assert all(general in p and heat in p for p in shown["pick_heat_then_place_in_recep"])
    # Without the flag (Skill-GRPO, not Skill-GRPO*) no prompt carries a skill.
    plain = prompts()
    assert all(general not in p and heat not in p for ps in plain.values() for p in ps)


def test_prompt_skill_bank_is_a_taspo_eval_flag():
    from trl import TrlParser

    from taspo_trl.script_args import AgentScriptArguments

    _, args = TrlParser((AgentScriptArguments, EvalArguments)).parse_args_and_config(
        args=["--prompt_skill_bank", "alfworld", "--prompt_skill_top_k", "3"])
    assert (args.prompt_skill_bank, args.prompt_skill_top_k) == ("alfworld", 3)
    assert EvalArguments().prompt_skill_bank is None  # off unless asked for


def test_bf16_evaluation_samples_under_autocast(tiny_model_dir):
    """``--bf16`` makes the sampler run the float32 model's matmuls in bfloat16, as a bf16 training run samples."""
    import torch

    from taspo_trl.evaluation import transformers_generator

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    for bf16, dtype in ((False, torch.float32), (True, torch.bfloat16)):
        seen.clear()
        generator = transformers_generator(model, tokenizer, EvalArguments(bf16=bf16, max_completion_length=4))
        generator([tokenizer("open the locker")["input_ids"]])
        assert set(seen) == {dtype}
