"""Command-line entry points.

    taspo-train --config alfworld_grpo_cpu [--key value ...]

``--config`` takes a YAML file or the name of a shipped recipe (``taspo-recipes list``). The YAML follows TRL's
``TrlParser`` conventions: top-level keys are fields of the script arguments below, of the method's config class
(``AgentGRPOConfig`` for ``method: grpo``, ``AgentSFTConfig`` for the ``method: sft`` warm start on expert
demonstrations) and of ``trl.ModelConfig`` (model path, LoRA settings); an ``env:`` block of environment variables
is exported first (as in TRL; the environment to train in is the ``environment:`` key); command-line flags override
the file.
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
    """What to train on, beyond the trainer config (whose `environment` field names the benchmark).

    Parameters:
        method (`str`, defaults to `"grpo"`): credit method, a key of `taspo_trl.trainers.CONFIGS` or a name
            registered with `taspo_trl.credit.registry.register_credit`, or `sft` for a warm start on the
            environment's expert demonstrations (TRL's `SFTTrainer`).
        games_dir (`str`): ALFWorld game folder; generated there with the embedded generator when it holds no
            `.tw-pddl` file. Official games (`$ALFWORLD_DATA/json_2.1.1/train`) work the same way.
        games_per_type (`int`, defaults to `2`): generated games per task family when generating.
        games_seed (`int`, defaults to `0`): generator seed.
        games_split (`str`, defaults to `"train"`): generator split (`train`, `eval_seen`, `eval_unseen`).
        task_source (`str`, defaults to `"embedded"`): Search-QA: `embedded` or a folder of the official
            Search-R1 files; WebShop: `embedded`.
        task_split (`str`, defaults to `"train"`): Search-QA `train`/`test`; WebShop `train`/`eval`.
        datasets (`list[str]` or `None`): Search-QA datasets to use from `task_source` (default: all found).
        retriever (`str`, defaults to `"embedded"`): Search-QA retriever: `embedded` (bm25s over the shipped
            corpus) or the URL of a Search-R1-style retrieval server (`http://127.0.0.1:8000`).
        retrieval_topk (`int`, defaults to `3`): Search-QA documents per search.
        webshop_url (`str` or `None`): WebShop: URL of a running official WebShop server; `None` = embedded.
        max_tasks (`int` or `None`): use at most this many tasks (after sorting, for reproducibility).
    """

    method: str = field(default="grpo", metadata={"help": "Credit method (a key of taspo_trl.trainers.CONFIGS)."})
    games_dir: str = field(default="outputs/alfworld_games/train", metadata={"help": "ALFWorld game folder."})
    games_per_type: int = field(default=2, metadata={"help": "Generated games per task family."})
    games_seed: int = field(default=0, metadata={"help": "Generator seed."})
    games_split: str = field(default="train", metadata={"help": "Generator split."})
    task_source: str = field(default="embedded", metadata={"help": "Search-QA/WebShop task source."})
    task_split: str = field(default="train", metadata={"help": "Search-QA/WebShop split."})
    datasets: list[str] | None = field(default=None, metadata={"help": "Search-QA datasets."})
    retriever: str = field(default="embedded", metadata={"help": "Search-QA retriever: embedded or a URL."})
    retrieval_topk: int = field(default=3, metadata={"help": "Search-QA documents per search."})
    webshop_url: str | None = field(default=None, metadata={"help": "Official WebShop server URL."})
    max_tasks: int | None = field(default=None, metadata={"help": "Use at most this many tasks."})


def _method_config_class(method: str) -> type:
    from .credit.registry import CREDIT_METHODS
    from .trainers import CONFIGS, method_classes
    from .trainers.sft import AgentSFTConfig

    if method == "sft":
        return AgentSFTConfig
    try:
        return method_classes(method)[0]
    except KeyError:
        known = sorted({*CONFIGS, *CREDIT_METHODS, "sft"})
        raise SystemExit(f"taspo-train: unknown method {method!r}; choose one of {known}.") from None


def resolve_config_argv(argv: list[str], program: str) -> list[str]:
    """``argv`` with the value of ``--config`` made a file path: a file that exists is used as it is, anything
    else names a shipped recipe (``alfworld_taspo_cpu``, ``paper/search/taspo_lora``), so an installed wheel
    runs its recipes from any directory."""
    from .recipes import find_recipe

    if "--config" not in argv[:-1]:
        return argv
    at = argv.index("--config") + 1
    if Path(argv[at]).is_file():
        return argv
    try:
        path = find_recipe(argv[at])
    except ValueError as error:
        raise SystemExit(f"{program}: --config {argv[at]}: no such file, and {error}.") from None
    return [*argv[:at], str(path), *argv[at + 1 :]]


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


def alfworld_game_files(games_dir: str | Path, per_type: int, seed: int, split: str) -> list[Path]:
    """The ``.tw-pddl`` files of a folder, generating ``per_type`` games per family there when it has none."""
    from .envs.alfworld import find_game_files, generate_games

    games_dir = Path(games_dir)
    files = find_game_files(games_dir) if games_dir.exists() else []
    if not files:
        print(
            f"[taspo] no games in {games_dir}: generating {per_type} per task family (split={split}, seed={seed})",
            flush=True,
        )
        files = generate_games(games_dir, per_type, seed, split)
    return sorted(files)


def build_task_rows(environment: str, script_args: AgentScriptArguments, max_turns: int | None = None) -> list[dict]:
    """The dataset rows (one task each) of ``environment``, as selected by the script arguments."""
    turn_cap = {"max_turns": max_turns} if max_turns else {}  # else the environment's own limit
    if environment == "alfworld":
        from .envs.alfworld import task_spec_rows

        files = alfworld_game_files(
            script_args.games_dir, script_args.games_per_type, script_args.games_seed, script_args.games_split
        )
        rows = task_spec_rows(files[: script_args.max_tasks] if script_args.max_tasks else files)
    elif environment == "search":
        from .envs.search import search_task_rows

        rows = search_task_rows(
            source=script_args.task_source,
            split=script_args.task_split,
            datasets=script_args.datasets,
            max_tasks=script_args.max_tasks,
            retriever=script_args.retriever,
            topk=script_args.retrieval_topk,
            **turn_cap,
        )
    elif environment == "webshop":
        from .envs.webshop import webshop_task_rows

        rows = webshop_task_rows(
            source=script_args.task_source,
            split=script_args.task_split,
            max_tasks=script_args.max_tasks,
            seed=script_args.games_seed,
            url=script_args.webshop_url,
            **turn_cap,
        )
    else:
        raise SystemExit(
            f"taspo: environment {environment!r} has no task builder; use alfworld, search or webshop, or build "
            "the dataset in Python and call the trainer directly (see README, 'Bring your own environment')."
        )
    if not rows:
        raise SystemExit(f"taspo: no tasks found for environment {environment!r} with {script_args}.")
    return rows


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
    from .trainers import BaselineConfig, method_classes

    argv = resolve_config_argv(argv, "taspo-train")
    method = _method_from_argv(argv)
    config_class = _method_config_class(method)
    if config_class is BaselineConfig and "--baseline" not in argv:
        argv = [*argv, "--baseline", method]
    parser = TrlParser((AgentScriptArguments, config_class, ModelConfig))
    script_args, config, model_args = parser.parse_args_and_config(args=argv)
    logging.basicConfig(level=logging.INFO if config.log_level in ("info", "passive") else logging.WARNING)

    name = model_override or model_args.model_name_or_path
    if not name:
        raise SystemExit("taspo-train: set model_name_or_path (e.g. embedded:smollm2-135m-instruct or a HF model).")
    model_path = resolve_policy_path(name)
    rows = build_task_rows(config.environment, script_args, config.max_turns)
    if method == "sft":
        return _sft_trainer(rows, config, model_path, get_peft_config(model_args), callbacks)
    dataset = Dataset.from_list(rows)
    print(f"[taspo-train] method={method} env={config.environment} tasks={len(dataset)} model={model_path}", flush=True)
    return method_classes(method)[1](
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
