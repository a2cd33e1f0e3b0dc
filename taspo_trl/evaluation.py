"""``taspo-eval``: evaluate a checkpoint (or a base model) on a fixed task set and write a results table.

    taspo-eval --model_name_or_path outputs/quickstart_taspo --environment alfworld --games_per_type 2
    taspo-eval --config alfworld_taspo_cpu --model_name_or_path outputs/quickstart_taspo

A training recipe can be passed with ``--config`` (a YAML file or a shipped recipe's name): the keys evaluation
shares with training (environment, turn limits, layout, prompt and response lengths, task source) carry over
and the rest are ignored, so a run is evaluated under the settings it was trained with. The tasks are fixed
(generated or loaded by seed), one episode per task, and sampling is seeded per batch, so two evaluations of
one checkpoint give the same table.

``--prompt_skill_bank`` shows each task's top-k skills in the policy's prompt at evaluation time, retrieved and
rendered exactly as training's ``prompt_skill_bank`` does: a Skill-GRPO checkpoint evaluated this way is the
papers' Skill-GRPO*, the untrained model their Skill-Prompt* (docs/methods.md).

Each split gives one JSON file (``{results_dir}/{environment}_{split}.json``), the format that
``taspo-report table`` renders side by side: per task family (ALFWorld) or dataset (Search-QA) or product
category (WebShop), the success rate, the mean score and the mean number of steps of successful episodes.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("taspo_trl")

DEFAULT_SPLITS = {"alfworld": ["eval_seen", "eval_unseen"], "webshop": ["eval"], "search": ["test"]}


@dataclass
class EvalArguments:
    """How to evaluate (task selection comes from `AgentScriptArguments`).

    Parameters:
        model_name_or_path (`str`, defaults to `"embedded:smollm2-135m-instruct"`): checkpoint, Hub name or
            the embedded model. A PEFT adapter folder is loaded on top of its base model.
        label (`str` or `None`): the row name in the results table (default: the method, else the model).
        environment (`str`, defaults to `"alfworld"`): `alfworld`, `webshop`, `search` or one you registered
            with its task rows (`--env_module`).
        splits (`list[str]` or `None`): default ALFWorld `eval_seen eval_unseen` (generated under
            `games_root/<split>`), WebShop `eval` (the 128 fixed goals), Search-QA `test`; required for your own
            environments, whose row builder receives each as `task_split`.
        games_root (`str`, defaults to `"outputs/alfworld_games"`): parent folder of the ALFWorld split folders.
        layout (`str`, defaults to `"turn"`), history_window (`int`, defaults to `3`), max_turns (`int` or
            `None`), max_prompt_tokens (`int` or `None`), max_completion_length (`int`, defaults to `512`):
            as in training (Table C.2: 50/15/4 turns, 512 response tokens).
        temperature (`float`, defaults to `1.0`): sampling temperature; `0` decodes greedily. The papers do not
            state their evaluation decoding, so the default is the rollout setting of Table C.2.
        top_p (`float`, defaults to `1.0`): nucleus sampling.
        seed (`int`, defaults to `0`): sampling seed, reset before every batch.
        eval_batch_size (`int`, defaults to `16`): episodes played in parallel.
        num_env_workers (`int`, defaults to `0`): environment worker processes (0: in process).
        results_dir (`str`, defaults to `"outputs/eval"`): where the JSON and markdown results go.
        device (`str`, defaults to `"cpu"`): `cpu`, `cuda`, ...
        dtype (`str`, defaults to `"float32"`): model dtype (`bfloat16` on GPUs).
        prompt_skill_bank (`str` or `None`, defaults to `None`): a SkillBank (`alfworld`, `webshop`, `searchqa`
            or a JSONL path) whose top-`prompt_skill_top_k` skills for each task are shown in the policy's prompt,
            as in training with the same field (Skill-GRPO*, Skill-Prompt*). `None`: no skills.
        prompt_skill_top_k (`int`, defaults to `2`): skills retrieved per task for `prompt_skill_bank`.
    """

    model_name_or_path: str = field(default="embedded:smollm2-135m-instruct", metadata={"help": "Model to evaluate."})
    label: str | None = field(default=None, metadata={"help": "Row name in the results table."})
    environment: str = field(default="alfworld", metadata={"help": "Registered environment name."})
    splits: list[str] | None = field(default=None, metadata={"help": "Splits to evaluate."})
    games_root: str = field(default="outputs/alfworld_games", metadata={"help": "ALFWorld split folders' parent."})
    layout: str = field(default="turn", metadata={"help": "turn or sequence."})
    history_window: int = field(default=3, metadata={"help": "Recent steps shown in turn prompts."})
    max_turns: int | None = field(default=None, metadata={"help": "Turn cap (None: the environment's)."})
    max_prompt_tokens: int | None = field(default=None, metadata={"help": "Prompt token cap."})
    max_completion_length: int = field(default=512, metadata={"help": "Response tokens per turn."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0: greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    eval_batch_size: int = field(default=16, metadata={"help": "Episodes played in parallel."})
    num_env_workers: int = field(default=0, metadata={"help": "Environment worker processes."})
    results_dir: str = field(default="outputs/eval", metadata={"help": "Output folder."})
    device: str = field(default="cpu", metadata={"help": "Device."})
    dtype: str = field(default="float32", metadata={"help": "Model dtype."})
    prompt_skill_bank: str | None = field(default=None, metadata={"help": "Skills in the policy prompt (Skill-GRPO*)."})
    prompt_skill_top_k: int = field(default=2, metadata={"help": "Skills per task for prompt_skill_bank."})


def summarize(trajectories: list[Any]) -> dict[str, Any]:
    """Per-group and overall success, mean score and mean steps of successful episodes.

    A trajectory's group is its ``task_type``; its score is its reward (WebShop's graded score, Search-QA's
    exact match, ALFWorld's 0/1).
    """
    groups: dict[str, list[Any]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.task_type or "unknown"].append(trajectory)

    def stats(items: list[Any]) -> dict[str, Any]:
        wins = [t for t in items if t.won]
        return {
            "n": len(items),
            "success": len(wins) / len(items) if items else 0.0,
            "score": sum(t.reward for t in items) / len(items) if items else 0.0,
            "mean_steps_success": sum(t.num_turns for t in wins) / len(wins) if wins else None,
        }

    return {"groups": {name: stats(items) for name, items in sorted(groups.items())}, "overall": stats(trajectories)}


def evaluate_rows(
    rows: list[dict[str, Any]],
    model: Any,
    tokenizer: Any,
    args: EvalArguments,
    env_factory: Any,
    generate: Any = None,
) -> list[Any]:
    """Play one episode per row with ``model`` and return the trajectories in row order.

    ``generate`` replaces the default sampler (``TransformersGenerator`` with the arguments' decoding settings),
    e.g. with a vLLM-backed generator or a scripted policy.
    """
    import torch

    from .envs.base import PromptTemplate, task_spec_from_row
    from .privileged.skillbank import SkillBank, add_skill_guidance
    from .rollout.chat import ChatFormat
    from .rollout.env_pool import EnvPool
    from .rollout.generation import TransformersGenerator
    from .rollout.loop import run_agent_loop

    chat = ChatFormat(tokenizer)
    skills = SkillBank.load(args.prompt_skill_bank) if args.prompt_skill_bank else None
    generator = generate or TransformersGenerator(
        model, tokenizer, max_new_tokens=args.max_completion_length, temperature=args.temperature, top_p=args.top_p
    )
    template = PromptTemplate(history_window=args.history_window)
    pool = EnvPool(env_factory, num_workers=args.num_env_workers)
    trajectories: list[Any] = []
    try:
        for start in range(0, len(rows), args.eval_batch_size):
            batch = rows[start : start + args.eval_batch_size]
            began = time.perf_counter()
            specs = [task_spec_from_row(row) for row in batch]
            if skills is not None:  # the trainer's own retrieval and rendering, so train and test prompts agree
                add_skill_guidance(specs, skills, args.prompt_skill_top_k)
            # Seeded after retrieval: loading the encoder on first use must not shift the sampling stream.
            torch.manual_seed(args.seed + start)
            trajectories += run_agent_loop(
                specs,
                pool,
                generator,
                chat,
                layout=args.layout,
                template=template,
                max_turns=args.max_turns,
                max_prompt_tokens=args.max_prompt_tokens,
            )
            done = trajectories[-len(batch) :]
            print(
                f"[taspo-eval] episodes {start + len(batch)}/{len(rows)}: success "
                f"{sum(t.won for t in done)}/{len(batch)} in {time.perf_counter() - began:.0f}s",
                flush=True,
            )
    finally:
        pool.shutdown()
    return trajectories


def _split_rows(split: str, args: EvalArguments, script_args: Any) -> list[dict[str, Any]]:
    from .envs import build_task_rows

    settings = asdict(script_args)
    if args.environment == "alfworld":
        settings.update(games_dir=str(Path(args.games_root) / split), games_split=split)
    else:
        settings.update(task_split=split)
    return build_task_rows(args.environment, settings, args.max_turns)


def run_evaluation(args: EvalArguments, script_args: Any) -> list[dict[str, Any]]:
    """Evaluate every split; writes one JSON per split and ``results.md``; returns the result dicts."""
    import torch

    from .envs import get_env_factory
    from .models import load_model_and_tokenizer
    from .warmstart import resolve_policy_path
    from .reporting import PAPER_ENVS, render_groups_table, render_results_table, render_steps_table

    splits = args.splits or DEFAULT_SPLITS.get(args.environment)
    if not splits:
        raise SystemExit(f"taspo-eval: name the splits to evaluate for environment {args.environment!r} (--splits).")
    env_factory = get_env_factory(args.environment)
    split_rows = {split: _split_rows(split, args, script_args) for split in splits}  # bad task input fails early
    model, tokenizer = load_model_and_tokenizer(resolve_policy_path(args.model_name_or_path), dtype=getattr(torch, args.dtype), device=args.device)
    label = args.label or Path(args.model_name_or_path).name
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for split, rows in split_rows.items():
        print(f"[taspo-eval] {args.environment}/{split}: {len(rows)} tasks, model={args.model_name_or_path}", flush=True)
        trajectories = evaluate_rows(rows, model, tokenizer, args, env_factory)
        result = {
            "env": args.environment,
            "model": args.model_name_or_path,
            "method": label,
            "split": split,
            "num_tasks": len(rows),
            "seed": args.seed,
            "temperature": args.temperature,
            **summarize(trajectories),
        }
        path = out_dir / f"{args.environment}_{split}.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"[taspo-eval] wrote {path}", flush=True)
        results.append(result)
    table = (render_results_table if args.environment in PAPER_ENVS else render_groups_table)(results)
    if args.environment == "alfworld":  # Table 4: mean steps of the successful episodes
        table += "\n\nMean steps of successful episodes:\n\n" + render_steps_table(results)
    (out_dir / "results.md").write_text(table + "\n")
    print(table, flush=True)
    return results


def eval_main(argv: list[str] | None = None) -> None:
    """``taspo-eval``: parse flags (and an optional recipe), evaluate, print the table."""
    from trl import TrlParser

    from .script_args import AgentScriptArguments, import_env_module, resolve_config_argv

    argv = resolve_config_argv(list(sys.argv[1:] if argv is None else argv), "taspo-eval")
    parser = TrlParser((AgentScriptArguments, EvalArguments))
    script_args, args, _ignored_recipe_keys, unknown = parser.parse_args_and_config(
        args=argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    if unknown:
        raise SystemExit(f"taspo-eval: unknown arguments {unknown}; see taspo-eval --help.")
    import_env_module(script_args.env_module, "taspo-eval")
    logging.basicConfig(level=logging.WARNING)
    run_evaluation(args, script_args)


if __name__ == "__main__":
    eval_main()
