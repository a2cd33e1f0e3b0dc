"""Command-line entry points.

    taspo-train --config recipes/quickstart/alfworld_grpo_cpu.yaml [--key value ...]

The YAML follows TRL's ``TrlParser`` conventions: top-level keys are fields of the script arguments below,
of the method's config class (``AgentGRPOConfig`` for ``method: grpo``) and of ``trl.ModelConfig`` (model
path, LoRA settings); an ``env:`` block of environment variables is exported first (as in TRL; the
environment to train in is the ``environment:`` key); command-line flags override the file.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger("taspo_trl")


@dataclass
class AgentScriptArguments:
    """What to train on, beyond the trainer config.

    Parameters:
        method (`str`, defaults to `"grpo"`): credit method (`grpo`).
        games_dir (`str`): ALFWorld game folder; generated there with the embedded generator when it holds no
            `.tw-pddl` file. Official games (`$ALFWORLD_DATA/json_2.1.1/train`) work the same way.
        games_per_type (`int`, defaults to `2`): generated games per task family when generating.
        games_seed (`int`, defaults to `0`): generator seed.
        games_split (`str`, defaults to `"train"`): generator split (`train`, `eval_seen`, `eval_unseen`).
        max_tasks (`int` or `None`): use at most this many tasks (after sorting, for reproducibility).
    """

    method: str = field(default="grpo", metadata={"help": "Credit method: grpo."})
    games_dir: str = field(default="outputs/alfworld_games/train", metadata={"help": "ALFWorld game folder."})
    games_per_type: int = field(default=2, metadata={"help": "Generated games per task family."})
    games_seed: int = field(default=0, metadata={"help": "Generator seed."})
    games_split: str = field(default="train", metadata={"help": "Generator split."})
    max_tasks: int | None = field(default=None, metadata={"help": "Use at most this many tasks."})


def _method_config_class(method: str) -> type:
    from .trainers import CONFIGS

    if method not in CONFIGS:
        raise SystemExit(f"taspo-train: unknown method {method!r}; choose one of {sorted(CONFIGS)}.")
    return CONFIGS[method]


def _method_from_argv(argv: list[str]) -> str:
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--config")
    peek.add_argument("--method")
    known, _ = peek.parse_known_args(argv)
    if known.method:
        return known.method
    if known.config:
        path = Path(known.config)
        if not path.is_file():
            raise SystemExit(f"taspo-train: config file {path} does not exist.")
        data = yaml.safe_load(path.read_text()) or {}
        return str(data.get("method", "grpo"))
    return "grpo"


def build_alfworld_dataset(script_args: AgentScriptArguments) -> Any:
    """The task rows of an ALFWorld game folder, generating the folder's games first when it is empty."""
    from datasets import Dataset

    from .envs.alfworld import find_game_files, generate_games, task_spec_rows

    games_dir = Path(script_args.games_dir)
    files = find_game_files(games_dir) if games_dir.exists() else []
    if not files:
        print(
            f"[taspo-train] no games in {games_dir}: generating {script_args.games_per_type} per task family "
            f"(split={script_args.games_split}, seed={script_args.games_seed})",
            flush=True,
        )
        files = generate_games(games_dir, script_args.games_per_type, script_args.games_seed, script_args.games_split)
    files = sorted(files)[: script_args.max_tasks] if script_args.max_tasks else sorted(files)
    return Dataset.from_list(task_spec_rows(files))


def train_main(argv: list[str] | None = None) -> None:
    """``taspo-train``: parse the recipe, build the dataset and trainer, train, save."""
    from trl import ModelConfig, TrlParser, get_peft_config

    from .models import resolve_model_path
    from .trainers import TRAINERS
    from .trainers.progress import ProgressPrinter

    argv = list(sys.argv[1:] if argv is None else argv)
    method = _method_from_argv(argv)
    config_class = _method_config_class(method)
    parser = TrlParser((AgentScriptArguments, config_class, ModelConfig))
    script_args, config, model_args = parser.parse_args_and_config(args=argv)
    logging.basicConfig(level=logging.INFO if config.log_level in ("info", "passive") else logging.WARNING)

    if not model_args.model_name_or_path:
        raise SystemExit("taspo-train: set model_name_or_path (e.g. embedded:smollm2-135m-instruct or a HF model).")
    model_path = resolve_model_path(model_args.model_name_or_path)
    if config.environment != "alfworld":
        raise SystemExit(f"taspo-train: environment {config.environment!r} has no dataset builder yet.")
    dataset = build_alfworld_dataset(script_args)
    print(f"[taspo-train] method={method} env={config.environment} tasks={len(dataset)} model={model_path}", flush=True)

    trainer = TRAINERS[method](
        model=model_path,
        args=config,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
        callbacks=[ProgressPrinter()],
    )
    try:
        trainer.train()
    finally:
        trainer.close()
    trainer.save_model(config.output_dir)
    print(f"[taspo-train] done; model saved to {os.path.abspath(config.output_dir)}", flush=True)


if __name__ == "__main__":
    train_main()
