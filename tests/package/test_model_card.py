"""The model card a run's output gets: the Hub model it was made from, the recipe, the run's figures."""

from __future__ import annotations

import json
from pathlib import Path

from taspo_trl import TASPOConfig
from taspo_trl.model_card import base_model_origin, last_metrics, recipe_settings
from taspo_trl.models import EMBEDDED_MODEL, embedded_model_dir


def test_the_base_model_is_named_by_its_hub_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    smollm = "HuggingFaceTB/SmolLM2-135M-Instruct"
    embedded_model_dir().mkdir(parents=True)
    assert base_model_origin(str(embedded_model_dir())) == (smollm, None)
    assert base_model_origin(EMBEDDED_MODEL) == (smollm, None)
    assert base_model_origin("Qwen/Qwen2.5-3B-Instruct") == ("Qwen/Qwen2.5-3B-Instruct", None)
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "warm_start.json").write_text(json.dumps(
        {"name": "embedded:smollm2-135m-alfworld", "fingerprint": {"settings": {"base_model": EMBEDDED_MODEL}}}))
    assert base_model_origin(str(warm)) == (smollm, "embedded:smollm2-135m-alfworld")
    assert base_model_origin(str(tmp_path)) == (None, None)  # a user's own folder: unknown, never "None" as an id


def test_the_recipe_lists_what_the_run_changed_and_not_where_it_wrote(tmp_path: Path) -> None:
    args = TASPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, max_steps=3, c_delta=1.5, learning_rate=2e-6,
                       logging_steps=7, bf16=False)
    settings = recipe_settings(args)
    assert settings["max_steps"] == 3 and settings["c_delta"] == 1.5 and settings["learning_rate"] == 2e-6
    assert "output_dir" not in settings and "logging_steps" not in settings
    assert "num_generations" not in settings  # left at its default


def test_the_results_are_those_of_the_last_logged_step() -> None:
    """A family played only at step 1 is not reported as if it were step 2's."""
    history = [{"success/all": 0.25, "success/look": 1.0, "reward": 0.25, "loss": 0.1, "step": 1},
               {"success/all": 0.75, "success/cool": 0.5, "reward": 0.75, "loss": 0.2, "step": 2},
               {"eval_success/all": 0.5, "eval_loss": 0.3, "step": 2}]
    assert last_metrics(history) == {"success/all": 0.75, "success/cool": 0.5, "reward": 0.75,
                                     "eval_success/all": 0.5, "eval_loss": 0.3}


def test_a_python_sft_save_writes_this_projects_card(tiny_model_dir, embedded_tokenizer, tmp_path: Path) -> None:
    """``AgentSFTTrainer.save_model`` from Python (not only through taspo-train) writes the agent card, as the RL
    trainers do, for a full model and for a LoRA adapter (whose save would otherwise keep PEFT's blank card)."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from taspo_trl.envs.alfworld import generate_games, task_spec_rows
    from taspo_trl.trainers.sft import AgentSFTConfig, AgentSFTTrainer, demonstration_sft_dataset

    games = generate_games(tmp_path / "games", 1, 0, "train", task_types=["pick_and_place_simple"])
    tokenizer = embedded_tokenizer.__class__.from_pretrained(tiny_model_dir)
    for name, peft_config in (("full", None), ("lora", LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))):
        config = AgentSFTConfig(output_dir=str(tmp_path / name), history_window=1, use_cpu=True, bf16=False,
                                gradient_checkpointing=False, max_length=None, report_to="none")
        dataset = demonstration_sft_dataset(task_spec_rows(games), tokenizer, config)
        trainer = AgentSFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=config,
                                  train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config)
        trainer.save_model()
        card = (tmp_path / name / "README.md").read_text()
        assert "trained with **SFT**" in card and "taspo-trl" in card, card[:600]
        assert "taspo-eval --model_name_or_path" in card and "fine-tuned version of" not in card
        assert ("as a LoRA adapter" in card) is (peft_config is not None)
