"""Command-line entry points.

    taspo-train --config alfworld_grpo_cpu [--key value ...]

``--config`` takes a YAML file or the name of a shipped recipe (``taspo-recipes list``). The YAML follows TRL's
``TrlParser`` conventions: top-level keys are fields of the script arguments (``script_args.py``), of the
method's config class (``AgentGRPOConfig`` for ``method: grpo``, ``AgentSFTConfig`` for the ``method: sft`` warm
start on expert demonstrations) and of ``trl.ModelConfig`` (model path, LoRA settings); an ``env:`` block of
environment variables is exported first (as in TRL; the environment to train in is the ``environment:`` key);
command-line flags override the file. ``--env_module my_envs`` imports a module that registers your own
environments (``taspo_trl.envs.register_env``) before the environment is looked up.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from .envs import build_task_rows
from .script_args import AgentScriptArguments, import_env_module, resolve_config_argv

logger = logging.getLogger("taspo_trl")


def _method_config_class(method: str) -> type:
    from .trainers import CONFIGS
    from .trainers.sft import AgentSFTConfig

    if method == "sft":
        return AgentSFTConfig
    if method not in CONFIGS:
        raise SystemExit(f"taspo-train: unknown method {method!r}; choose one of {sorted([*CONFIGS, 'sft'])}.")
    return CONFIGS[method]


def _method_from_argv(argv: list[str]) -> str:
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--config")
    peek.add_argument("--method")
    known, _ = peek.parse_known_args(argv)
    if known.method:
        return known.method
    if known.config:
        data = yaml.safe_load(Path(known.config).read_text()) or {}
        return str(data.get("method", "grpo"))
    return "grpo"


def build_trainer(
    argv: list[str], callbacks: list | None = None, model_override: str | None = None, reward_funcs: list | None = None
) -> Any:
    """Parse a recipe plus command-line overrides and build its dataset and trainer (no training).

    ``model_override`` replaces the recipe's model (the recipe tests build every recipe with a tiny model);
    ``reward_funcs`` replaces the default reward (the environment's verified reward).
    """
    from datasets import Dataset
    from trl import ModelConfig, TrlParser, get_peft_config

    from .warmstart import resolve_policy_path
    from .trainers import BASELINES, TRAINERS

    argv = resolve_config_argv(argv, "taspo-train")
    method = _method_from_argv(argv)
    config_class = _method_config_class(method)
    if method in BASELINES and "--baseline" not in argv:
        argv = [*argv, "--baseline", method]
    parser = TrlParser((AgentScriptArguments, config_class, ModelConfig))
    script_args, config, model_args = parser.parse_args_and_config(args=argv)
    import_env_module(script_args.env_module, "taspo-train")
    logging.basicConfig(level=logging.INFO if config.log_level in ("info", "passive") else logging.WARNING)

    name = model_override or model_args.model_name_or_path
    if not name:
        raise SystemExit("taspo-train: set model_name_or_path (e.g. embedded:smollm2-135m-instruct or a HF model).")
    model_path = resolve_policy_path(name)
    rows = build_task_rows(config.environment, asdict(script_args), config.max_turns)
    if method == "sft":
        return _sft_trainer(rows, config, model_path, get_peft_config(model_args), callbacks)
    dataset = Dataset.from_list(rows)
    print(f"[taspo-train] method={method} env={config.environment} tasks={len(dataset)} model={model_path}", flush=True)
    return TRAINERS[method](
        model=model_path,
        args=config,
        train_dataset=dataset,
        reward_funcs=reward_funcs,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )


def _sft_trainer(rows: list[dict], config: Any, model_path: str, peft_config: Any, callbacks: list | None) -> Any:
    """TRL's ``SFTTrainer`` (``AgentSFTTrainer``) on the expert demonstrations of ``rows`` (``method: sft``)."""
    from transformers import AutoTokenizer

    from .models import prepare_tokenizer
    from .trainers.sft import AgentSFTTrainer, demonstration_sft_dataset

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_path))
    tokenizer.padding_side = "right"  # training pads on the right
    dataset = demonstration_sft_dataset(rows, tokenizer, config)
    print(
        f"[taspo-train] method=sft env={config.environment} tasks={len(rows)} demonstration turns={len(dataset)} "
        f"model={model_path}",
        flush=True,
    )
    return AgentSFTTrainer(
        model=model_path, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config,
        callbacks=callbacks,
    )


def train_main(argv: list[str] | None = None) -> None:
    """``taspo-train``: parse the recipe, build the dataset and trainer, train, save."""
    from .trainers.progress import ProgressPrinter

    trainer = build_trainer(list(sys.argv[1:] if argv is None else argv), callbacks=[ProgressPrinter()])
    try:
        trainer.train()
    finally:
        if hasattr(trainer, "close"):  # the agent trainers' environment workers; SFTTrainer has none
            trainer.close()
    trainer.save_model(trainer.args.output_dir)
    trainer.save_state()  # trainer_state.json: the log history `taspo-report curves` reads
    print(f"[taspo-train] done; model saved to {os.path.abspath(trainer.args.output_dir)}", flush=True)


if __name__ == "__main__":
    train_main()
