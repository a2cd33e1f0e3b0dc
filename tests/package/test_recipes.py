"""Every shipped recipe parses and builds its trainer (no training), so none rots; every ALFWorld quickstart
trains one optimizer step on the embedded ALFWorld (with a tiny policy in place of the embedded model)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from taspo_trl.cli import build_trainer
from taspo_trl.envs import get_env_factory
from taspo_trl.envs.alfworld import find_game_files, task_spec_rows
from taspo_trl.evaluation import EvalArguments, evaluate_rows, summarize
from taspo_trl.reporting import render_results_table

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*/**/*.yaml"))
TRAINING_RECIPES = [p for p in RECIPES if "accelerate" not in p.parts]
ALFWORLD_QUICKSTARTS = sorted(p for p in (ROOT / "recipes" / "quickstart").glob("alfworld_*_cpu.yaml") if "_sft_" not in p.name)
SFT_RECIPES = sorted((ROOT / "recipes" / "quickstart").glob("*_sft_cpu.yaml"))


def _cpu_overrides(recipe: Path, tmp_path: Path, games_dir: Path, tiny_model_dir: str) -> list[str]:
    """What a CPU box without the paper's data, GPUs or 7B teacher must change; everything else is the recipe's."""
    data = yaml.safe_load(recipe.read_text())
    argv = ["--config", str(recipe), "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    argv += ["--use_cpu", "true", "--bf16", "false", "--use_vllm", "false", "--gradient_checkpointing", "false"]
    # Few tasks keep the build fast, but at least one generation batch's worth: with fewer the run would train 0 steps.
    steps = data.get("steps_per_generation") or data.get("gradient_accumulation_steps", 1)
    per_step = data.get("per_device_train_batch_size", 8) * steps // data.get("num_generations", 8)
    argv += ["--games_dir", str(games_dir), "--max_tasks", str(max(4, per_step))]
    if data.get("environment") == "search":
        argv += ["--task_source", "embedded", "--retriever", "embedded", "--search_datasets", "embedded_single"]
    if data.get("teacher_model_name_or_path"):
        argv += ["--teacher_model_name_or_path", tiny_model_dir]
    return argv


def test_recipes_match_their_generator():
    result = subprocess.run([sys.executable, str(ROOT / "recipes" / "generate.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_recipe_grid_is_complete():
    names = {p.relative_to(ROOT / "recipes").as_posix() for p in TRAINING_RECIPES}
    for env in ("alfworld", "webshop", "search"):
        for method in ("grpo", "taspo", "alignopsd", "sdar", "opsd", "grpo_opsd", "gigpo", "rlsd", "opid", "stepopsd"):
            assert f"paper/{env}/{method}_qwen2.5-3b.yaml" in names
        for variant in ("qwen2.5-7b", "qwen3-1.7b", "lora"):
            assert f"paper/{env}/taspo_{variant}.yaml" in names
    for path in (ROOT / "recipes" / "accelerate").glob("*.yaml"):
        assert "distributed_type" in yaml.safe_load(path.read_text())


def _recipes(method: str, env: str | None = None) -> list[Path]:
    chosen = []
    for path in TRAINING_RECIPES:
        data = yaml.safe_load(path.read_text())
        if data["method"] == method and env in (None, data["environment"]):
            chosen.append(path)
    return chosen


def test_taspo_recipes_run_the_aligned_pi_on_every_benchmark():
    """TASPO's method, not the Table 2 ablation, on all three benchmarks: the rule-based analyzer reads them all."""
    recipes = _recipes("taspo")
    assert {yaml.safe_load(p.read_text())["environment"] for p in recipes} == {"alfworld", "webshop", "search"}
    for path in recipes:
        data = yaml.safe_load(path.read_text())
        assert (data["pi_source"], data["analyzer"]) == ("aligned", "rule"), path.name


def test_baseline_recipes_run_their_methods_missing_parts():
    """OPID with its step skills, Skill-SD with the analyzer's skills from the successes and a periodically synced
    teacher, and every analyzer-driven recipe with the paper's reasoning-off analyzer."""
    for path in _recipes("opid"):
        data = yaml.safe_load(path.read_text())
        assert (data["pi_source"], data["opid_max_step_skills"], data["opid_step_weight"]) == ("aligned", 5, 0.001)
    for path in _recipes("skill_sd"):
        data = yaml.safe_load(path.read_text())
        assert (data["pi_source"], data["teacher_sync_steps"]) == ("success_skills", 10), path.name
    for method in ("taspo", "opid", "skill_sd"):
        for path in _recipes(method):
            assert yaml.safe_load(path.read_text())["analyzer_reasoning"] == "off", path.name


# The official launchers' values (mingju-c/Align-OPSD, examples/beyond_timestamps_trainer/run_<benchmark>_<size>.sh),
# read off the launchers, as recipe keys. Per profile: tau, k, alpha_max, aggregation, credit temperature, GRPO scope,
# action filter, invalid-action coefficient, teacher budget (None: the launcher's null), KL, max turns, max prompt
# tokens, warmup ratio, tasks per step.
OFFICIAL_LAUNCHERS = {
    ("alfworld", "qwen2.5-3b"): (0.65, 2, 0.8, "probability_mixture", 0.5, "turn", True, 0.1, 2048, 0.01, 50, 2048, 0.0, 16),
    ("alfworld", "qwen2.5-7b"): (0.8, 3, 0.8, "probability_mixture", 0.5, "turn", False, 0.1, 2048, 0.01, 50, 2048, 0.0, 16),
    ("webshop", "qwen2.5-3b"): (0.8, 3, 0.8, "probability_mixture", 0.2, "turn", True, 0.1, 2048, 0.01, 15, 4096, 0.0, 16),
    ("webshop", "qwen2.5-7b"): (0.8, 2, 0.8, "probability_mixture", 0.5, "turn", False, 0.1, 2048, 0.01, 15, 4096, 0.0, 16),
    ("search", "qwen2.5-3b"): (0.7, 3, 0.2, "log_mean", 1.0, "trajectory", False, 0.01, None, 0.001, 4, 4096, 0.1, 128),
    ("search", "qwen2.5-7b"): (0.7, 3, 0.8, "probability_mixture", 0.5, "turn", False, 0.01, 2048, 0.001, 4, 4096, 0.1, 128),
}
# Shared by all six launchers.
OFFICIAL_SHARED = dict(
    num_generations=8, learning_rate=1e-6, max_completion_length=512, temperature=1.0, top_p=1.0, max_steps=150,
    loss_type="dapo", turn_balanced_loss=False, aggregation_temperature=0.1, action_threshold=0.8,
    profile_temperature=0.1, profile_distance="jsd", segmentation_quantile=0.8, segmentation_threshold_min=0.01,
    segmentation_threshold_max=0.1, span_min_turns=2, span_max_turns=8, mixing_coefficient=0.5,
    density_upper_bound=4.0, weighting_mode="legacy", advantage_epsilon=1e-6, ablation="E",
)
OFFICIAL_KEYS = ("similarity_threshold", "source_top_k", "alpha_max", "aggregation_mode", "credit_temperature",
                 "grpo_normalization_scope", "action_filter", "invalid_action_coef", "teacher_max_new_tokens", "beta",
                 "max_turns", "max_prompt_tokens", "warmup_steps")


@pytest.mark.parametrize(("env", "model"), sorted(OFFICIAL_LAUNCHERS), ids=lambda v: str(v))
def test_alignopsd_recipes_carry_the_official_launcher_values(env, model):
    data = yaml.safe_load((ROOT / "recipes" / "paper" / env / f"alignopsd_{model}.yaml").read_text())
    *values, tasks = OFFICIAL_LAUNCHERS[(env, model)]
    assert {key: data[key] for key in OFFICIAL_KEYS} == dict(zip(OFFICIAL_KEYS, values))
    assert {key: data[key] for key in OFFICIAL_SHARED} == OFFICIAL_SHARED
    # The recipes are sized for 8 GPUs: per-device batch x accumulation x 8 = tasks x 8 rollouts.
    assert data["per_device_train_batch_size"] * data["gradient_accumulation_steps"] * 8 == tasks * 8
    # Only run_alfworld_3b.sh sets algorithm.sdar_aux: enabled=true, coef=0.01, gate_beta=5.0 (the others leave
    # the config file's enabled: false).
    sdar = (data.get("sdar_aux", False), data.get("sdar_aux_coef", 0.01), data.get("sdar_aux_gate_beta", 5.0))
    assert sdar == ((env, model) == ("alfworld", "qwen2.5-3b"), 0.01, 5.0)
    # ALFWorld and WebShop validate at temperature 0.4 (the launchers' val_kwargs).
    assert ("--temperature 0.4" in (ROOT / "recipes" / "paper" / env / f"alignopsd_{model}.yaml").read_text()) == (env != "search")


def test_webshop_action_filter_keeps_only_the_same_operation_and_click_target(encoder):
    """The WebShop-3B profile's action filter (official ``action_consistency_mask(webshop=True)``): a target
    turn's sources click exactly what it clicks, even where the embeddings of two different clicks are within
    the 0.8 cosine filter ("small" / "x-small", two product ids); without the WebShop rule those would match."""
    from tests.helpers.kitchen import played

    from taspo_trl.envs.webshop import load_catalog, webshop_env_factory
    from taspo_trl.privileged.alignopsd import group_correspondence, parse_response

    data = yaml.safe_load((ROOT / "recipes" / "paper" / "webshop" / "alignopsd_qwen2.5-3b.yaml").read_text())
    assert data["action_filter"] is True
    goal = load_catalog(0).goal("train", 0)
    asin, search = goal["asin"].lower(), f"search[{goal['query']}]"
    env = webshop_env_factory({"goal_index": 0, "split": "train"})
    env.reset()
    env.step(search)
    other = next(c for c in env.admissible_commands if c[len("click["):-1].upper() in env._page().split(" [SEP] ")
                 and c != f"click[{asin}]")
    plans = [
        [search, f"click[{asin}]", "click[small]", "click[buy now]"],  # the target
        [search, f"click[{asin}]", "click[x-small]", "click[small]", "click[buy now]"],
        [search, other, "click[buy now]"],
    ]
    group = [played(webshop_env_factory({"goal_index": 0, "split": "train"}), plan) for plan in plans]
    # The same reasoning for the same decision in every rollout: which product to open, which size to pick.
    thoughts = {"search": "I search for the product.", "buy now": "Everything is chosen, so I buy it.",
                "small": "I pick the size.", "x-small": "I pick the size."}
    for trajectory in group:
        for turn in trajectory.turns:
            key = "search" if turn.action.startswith("search[") else turn.action[len("click["):-1]
            thought = thoughts.get(key, "This listing looks right, so I open it.")
            turn.response_text = f"<think>{thought}</think><action>{turn.action}</action>"
    teacher = {(i, t): parse_response(turn.response_text) for i, tr in enumerate(group) for t, turn in enumerate(tr.turns)}
    settings = dict(threshold=0.7, top_k=data["source_top_k"], action_filter=True, action_threshold=data["action_threshold"],
                    profile_temperature=0.1, profile_distance="jsd")

    def sources(trajectories) -> list[set[str]]:
        c = group_correspondence(trajectories, [0, 1, 2], teacher, encoder, **settings)
        return [{trajectories[c.keys[s][0]].turns[c.keys[s][1]].action for s in c.selected[row]} for row in c.rows_of(0)]

    exact_sources = sources(group)
    loose_group = [copy.copy(t) for t in group]
    for t in loose_group:
        t.env_name = "elsewhere"  # the embedding filter alone, as on the other benchmarks
    loose_sources = sources(loose_group)
    target_actions = [turn.action for turn in group[0].turns]
    assert all(found <= {action} for found, action in zip(exact_sources, target_actions, strict=True))
    assert exact_sources[0] == {search} and exact_sources[1] == {f"click[{asin}]"}
    assert other in loose_sources[1] and "click[x-small]" in loose_sources[2]  # what the exact rule keeps out


@pytest.mark.parametrize("recipe", [p for p in TRAINING_RECIPES if p not in SFT_RECIPES],
                         ids=lambda p: p.relative_to(ROOT / "recipes").as_posix())
def test_recipe_builds_its_trainer(recipe, tmp_path, family_games_dir, tiny_model_dir):
    trainer = build_trainer(_cpu_overrides(recipe, tmp_path, family_games_dir, tiny_model_dir),
                            model_override=tiny_model_dir)
    try:
        data = yaml.safe_load(recipe.read_text())
        assert trainer.args.environment == data["environment"]
        assert trainer.args.learning_rate == pytest.approx(float(data["learning_rate"]))
        assert trainer.args.beta == pytest.approx(float(data["beta"]))
        if data["method"] not in ("grpo", "taspo", "alignopsd"):
            assert trainer.args.baseline == data["method"]
        if data["method"] == "taspo":
            assert trainer.args.pi_source == "aligned"
        if data["method"] == "alignopsd":
            assert trainer.args.similarity_threshold == pytest.approx(float(data["similarity_threshold"]))
            assert trainer.args.action_filter == data["action_filter"]
            assert trainer.args.teacher_max_new_tokens == data["teacher_max_new_tokens"]
        if data.get("use_peft"):
            assert hasattr(trainer.model, "peft_config")
    finally:
        trainer.close()


@pytest.mark.parametrize("recipe", SFT_RECIPES, ids=lambda p: p.stem)
def test_sft_recipe_trains_on_expert_demonstrations(recipe, tmp_path, family_games_dir, tiny_model_dir):
    """The warm-start recipes build TRL's SFTTrainer on the expert's demonstrations, whose loss covers the
    responses only, and train one step."""
    from trl import SFTTrainer

    # The tiny model has 2 layers; one expert episode per game keeps the test short.
    data = yaml.safe_load(recipe.read_text())
    argv = _cpu_overrides(recipe, tmp_path, family_games_dir, tiny_model_dir) + [
        "--max_steps", "1", "--demonstrations_per_task", "1", "--demonstration_pi_episodes", "0",
        "--demonstration_foreign_pi_share", "0", "--demonstration_pi_corrections", "false",
        "--demonstration_thoughtless_share", "0", "--frozen_layers", "1",
    ]
    at = argv.index("--use_vllm")
    del argv[at : at + 2]  # an RL generation setting; SFT generates nothing
    trainer = build_trainer(argv, model_override=tiny_model_dir)
    assert isinstance(trainer, SFTTrainer) and trainer.args.completion_only_loss
    assert hasattr(trainer.model, "peft_config") is bool(data.get("use_peft"))
    assert trainer.args.learning_rate == pytest.approx(float(data["learning_rate"]))
    example = trainer.train_dataset[0]
    trained = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
    untrained = [t for t, label in zip(example["input_ids"], example["labels"]) if label == -100]
    decode = trainer.processing_class.decode
    assert decode(trained).startswith("<think>") and "</think>" in decode(trained)  # the expert's response only
    assert "Your task is" in decode(untrained) or "<|im_start|>user" in decode(untrained)
    assert trainer.train().global_step == 1
    from taspo_trl.model_card import write_model_card

    write_model_card(trainer, trainer.args.output_dir)  # as taspo-train ends
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    assert "trained with **SFT**" in card and "`SFTTrainer`" in card and "[None]" not in card


def test_alfworld_sft_recipe_is_the_builtin_warm_start():
    from taspo_trl.warmstart import WARM_STARTS

    data = yaml.safe_load((ROOT / "recipes" / "quickstart" / "alfworld_sft_cpu.yaml").read_text())
    spec = WARM_STARTS["embedded:smollm2-135m-alfworld"]
    for key in ("games_per_type", "games_seed", "layout", "history_window", "num_train_epochs", "learning_rate",
                "per_device_train_batch_size", "gradient_accumulation_steps", "seed", "demonstrations_per_task"):
        assert data[key] == getattr(spec, key), key
    assert data.get("frozen_layers", 0) == spec.frozen_layers
    assert data.get("use_peft", False) is bool(spec.lora_rank)
    if spec.lora_rank:
        assert data["lora_target_modules"] == "all-linear" and data["lora_dropout"] == 0.0
        assert (data["lora_r"], data["lora_alpha"]) == (spec.lora_rank, spec.lora_alpha)
    assert "bf16" not in data  # the precision follows the hardware, as the warm start's build does
    assert data["demonstration_mistake_rate"] == spec.mistake_rate
    assert data.get("demonstration_wander_rate", 0.0) == spec.wander_rate
    assert data.get("demonstration_stall_rate", 0.0) == spec.stall_rate
    assert data.get("demonstration_thoughtless_share", 0.0) == spec.thoughtless_share
    assert data.get("demonstration_pi_episodes", 0) == spec.pi_episodes
    assert data.get("demonstration_foreign_pi_share", 0.0) == spec.foreign_pi_share
    assert data.get("demonstration_pi_corrections", False) is spec.pi_corrections
    quickstart = yaml.safe_load((ROOT / "recipes" / "quickstart" / "alfworld_taspo_cpu.yaml").read_text())
    assert quickstart["model_name_or_path"] == "embedded:smollm2-135m-alfworld"
    assert quickstart["history_window"] == spec.history_window and quickstart["layout"] == spec.layout


@pytest.mark.parametrize("recipe", ALFWORLD_QUICKSTARTS, ids=lambda p: p.stem)
def test_alfworld_quickstart_trains_one_step(recipe, tmp_path, family_games_dir, tiny_model_dir):
    argv = _cpu_overrides(recipe, tmp_path, family_games_dir, tiny_model_dir)
    argv += ["--max_steps", "1", "--max_turns", "2", "--max_completion_length", "8"]
    # One task, two siblings, in one micro-batch.
    argv += ["--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1"]
    trainer = build_trainer(argv, model_override=tiny_model_dir)
    try:
        result = trainer.train()
    finally:
        trainer.close()
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert "success/all" in logged and result.training_loss == result.training_loss  # not NaN

    # The trained policy is evaluated like a checkpoint would be: one episode per family, a fixed seed.
    method = yaml.safe_load(recipe.read_text())["method"]
    args = EvalArguments(max_turns=1, max_completion_length=8, eval_batch_size=6)
    rows = task_spec_rows(find_game_files(family_games_dir))
    trajectories = evaluate_rows(rows, trainer.model, trainer.processing_class, args, get_env_factory("alfworld"))
    result_row = {"env": "alfworld", "method": method, "model": "tiny", "split": "eval_seen",
                  "num_tasks": len(rows), "seed": 0, **summarize(trajectories)}
    # Its Table-1 row, named after the method (each test renders its own: xdist spreads them over workers).
    table = render_results_table([result_row])
    body = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Method")]
    assert [line.split(" | ")[0][2:] for line in body] == [method]
    assert body[0].count("|") == 9  # method + Pick..Pick2 + All
