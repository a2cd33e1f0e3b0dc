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

from .precision import choose_precision
from .provenance import package_versions
from .script_args import mapping_setting

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
        layout (`str`, defaults to `"turn"`): row layout, as in training.
        history_window (`int`, defaults to `3`): past steps in each prompt, as in training.
        max_turns (`int` or `None`): turn cap, as in training (Table C.2: 50/15/4 turns).
        max_prompt_tokens (`int` or `None`): prompt cap, as in training.
        max_completion_length (`int`, defaults to `512`): response tokens per turn (Table C.2: 512).
        temperature (`float`, defaults to `1.0`): sampling temperature; `0` decodes greedily. The papers do not
            state their evaluation decoding, so the default is the rollout setting of Table C.2.
        top_p (`float`, defaults to `1.0`), top_k (`int`, defaults to `0`: off), min_p (`float` or `None`),
            repetition_penalty (`float`, defaults to `1.0`), generation_kwargs (`dict` or `None`): the sampling
            settings of `GRPOConfig`, with its meaning, so a recipe evaluates with the decoding it trained with;
            `generation_kwargs` (a JSON object on the command line) is applied over the others. With the
            transformers backend its keys must be `transformers.GenerationConfig` fields.
        use_vllm (`bool`, defaults to `False`): generate with TRL's vLLM integration (`trl.generation`), as
            training does with `use_vllm`; needs a CUDA GPU and `pip install 'taspo-trl[vllm]'`. On a machine
            without a CUDA GPU the evaluation uses transformers instead and says so, so a GPU recipe still
            evaluates on CPU. `vllm_mode` (`colocate` or `server`), `vllm_server_base_url` and
            `vllm_gpu_memory_utilization` mean what they mean in `GRPOConfig`.
        seed (`int`, defaults to `0`): sampling seed, reset before every batch.
        eval_batch_size (`int`, defaults to `16`): episodes played in parallel.
        num_env_workers (`int`, defaults to `0`): environment worker processes (0: in process).
        env_step_timeout (`float`, defaults to `300.0`): seconds an environment may take to reset or step (as
            training's `env_step_timeout`). An episode past it ends as failed with a logged warning and the
            evaluation goes on. With workers the worker is killed and replaced; in process the call is left
            running in a background thread (Python cannot interrupt it) and its episode is dropped.
        results_dir (`str`, defaults to `"outputs/eval"`): where the JSON and markdown results go.
        device (`str`, defaults to `"cpu"`): `cpu`, `cuda`, ...
        dtype (`str`, defaults to `"float32"`): model dtype (`bfloat16` on GPUs).
        bf16 (`bool` or `None`, defaults to `None`): sample under bf16 autocast over the model's weights, as
            training with `bf16` does: about 1.6x faster than float32 on a CPU with bfloat16 instructions
            (AVX512-BF16 or AMX), tens of times slower on one without. `None` follows the hardware (bf16 where
            `device` computes it natively, `taspo_trl.precision`); the choice and its reason are in `precision`.
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
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off)."})
    min_p: float | None = field(default=None, metadata={"help": "Min-p sampling (None: off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty (1.0: none)."})
    generation_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Further generation settings (JSON object), applied over the others."}
    )
    use_vllm: bool = field(default=False, metadata={"help": "Generate with TRL's vLLM integration (CUDA GPU)."})
    vllm_mode: str = field(default="colocate", metadata={"help": "vLLM mode: colocate or server."})
    vllm_server_base_url: str | None = field(default=None, metadata={"help": "vLLM server URL (server mode)."})
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM GPU memory share (colocate)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    eval_batch_size: int = field(default=16, metadata={"help": "Episodes played in parallel."})
    num_env_workers: int = field(default=0, metadata={"help": "Environment worker processes."})
    env_step_timeout: float = field(default=300.0, metadata={"help": "Seconds per environment reset/step."})
    results_dir: str = field(default="outputs/eval", metadata={"help": "Output folder."})
    device: str = field(default="cpu", metadata={"help": "Device."})
    dtype: str = field(default="float32", metadata={"help": "Model dtype."})
    bf16: bool | None = field(
        default=None, metadata={"help": "Sample under bf16 autocast (as training with bf16); unset: the hardware's choice."}
    )
    prompt_skill_bank: str | None = field(default=None, metadata={"help": "Skills in the policy prompt (Skill-GRPO*)."})
    prompt_skill_top_k: int = field(default=2, metadata={"help": "Skills per task for prompt_skill_bank."})

    def __post_init__(self) -> None:
        self.generation_kwargs = mapping_setting("generation_kwargs", self.generation_kwargs,
                                                 '{"no_repeat_ngram_size": 3}', "generation settings")
        self.top_k = self.top_k or 0  # a recipe's `top_k: null`, as GRPOConfig allows
        rules = {
            "temperature": (self.temperature >= 0, ">= 0 (0 decodes greedily)"),
            "top_p": (0 < self.top_p <= 1, "in (0, 1]"),
            "top_k": (self.top_k >= 0, ">= 0 (0: off)"),
            "min_p": (self.min_p is None or 0 <= self.min_p <= 1, "in [0, 1]"),
            "repetition_penalty": (self.repetition_penalty > 0, "> 0 (1.0: none)"),
            "env_step_timeout": (self.env_step_timeout > 0, "> 0 seconds"),
            "eval_batch_size": (self.eval_batch_size >= 1, ">= 1"),
            "max_completion_length": (self.max_completion_length >= 1, ">= 1 (response tokens per turn)"),
            "max_turns": (self.max_turns is None or self.max_turns >= 1, ">= 1 (or unset: the environment's)"),
            "max_prompt_tokens": (self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, ">= 1 (or unset)"),
            "history_window": (self.history_window >= 0, ">= 0"),
            "num_env_workers": (self.num_env_workers >= 0, ">= 0"),
        }
        for name, (ok, rule) in rules.items():
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)}; set --{name} accordingly.")
        if self.vllm_mode not in ("colocate", "server"):
            raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {self.vllm_mode!r}.")
        self.precision = choose_precision(self.bf16, use_cpu=not self.device.startswith("cuda"))
        self.bf16 = self.precision.bf16


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % for the default ``z``); (0, 1) with no trials."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * (p * (1 - p) / trials + z * z / (4 * trials * trials)) ** 0.5 / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(trajectories: list[Any]) -> dict[str, Any]:
    """Per-group and overall success with its 95 % Wilson interval and ``n``, mean score and mean steps of
    successful episodes.

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
            "errors": sum(_had_fault(t) for t in items),
            "success": len(wins) / len(items) if items else 0.0,
            "success_interval_95": list(wilson_interval(len(wins), len(items))),
            "score": sum(t.reward for t in items) / len(items) if items else 0.0,
            "mean_steps_success": sum(t.num_turns for t in wins) / len(wins) if wins else None,
        }

    return {"groups": {name: stats(items) for name, items in sorted(groups.items())}, "overall": stats(trajectories)}


def _had_fault(trajectory: Any) -> bool:
    """Whether the environment failed in this episode: at the end (``error``) or on a step it went on past."""
    return bool(getattr(trajectory, "had_fault", getattr(trajectory, "error", None) is not None))


class AllEpisodesFailed(RuntimeError):
    """Every episode of a split ended with an environment error: a success rate over them would measure the
    environment, not the model, so none is reported."""


def transformers_generator(model: Any, tokenizer: Any, args: EvalArguments) -> Any:
    """The transformers sampler with every decoding setting of ``args``; a ``generation_kwargs`` key that
    ``transformers.GenerationConfig`` does not know is refused here rather than by ``generate`` mid-evaluation."""
    from transformers import GenerationConfig

    from .rollout.generation import TransformersGenerator, sampling_autocast_dtype, sampling_settings

    unknown = sorted(set(args.generation_kwargs or {}) - set(GenerationConfig().to_dict()))
    if unknown:
        raise ValueError(
            f"generation_kwargs {unknown} are not transformers generation settings (GenerationConfig fields); "
            "remove them, or evaluate with --use_vllm true if they are vLLM SamplingParams."
        )
    return TransformersGenerator(
        model,
        tokenizer,
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        generation_kwargs=sampling_settings(args),
        autocast_dtype=sampling_autocast_dtype(args),
    )


class VLLMEvalGenerator:
    """Generates through TRL's vLLM integration (``trl.generation.vllm_generation.VLLMGeneration``), the engine
    training uses with ``use_vllm``, with the model's current weights pushed to it once."""

    def __init__(self, model: Any, tokenizer: Any, args: EvalArguments) -> None:
        from accelerate import Accelerator
        from trl.generation.vllm_generation import VLLMGeneration

        from .rollout.generation import _eos_ids

        self.stop_token_ids = _eos_ids(tokenizer, model)
        self.engine = VLLMGeneration(
            model,
            Accelerator(),
            tokenizer,
            mode=args.vllm_mode,
            server_base_url=args.vllm_server_base_url,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            repetition_penalty=args.repetition_penalty,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p or 0.0,
            max_completion_length=args.max_completion_length,
            generation_kwargs={"seed": args.seed, **(args.generation_kwargs or {})},
        )
        # vLLM loads `model.name_or_path` from disk: a merged LoRA checkpoint's weights exist only in memory.
        self.engine.sync_weights()

    def __call__(self, prompts: list[list[int]]) -> list[Any]:
        from .rollout.generation import Generation

        if not prompts:
            return []
        _, completions, logprobs, _ = self.engine.generate(prompts, None, num_generations=1)
        stop = set(self.stop_token_ids)
        return [
            Generation(list(ids), [float("nan") if lp[0] is None else float(lp[0]) for lp in lps], bool(ids) and ids[-1] in stop)
            for ids, lps in zip(completions, logprobs, strict=True)
        ]


def build_generator(model: Any, tokenizer: Any, args: EvalArguments) -> Any:
    """TRL's vLLM path when ``use_vllm`` is set and a CUDA GPU is present (vLLM missing: ``ImportError`` naming
    the extra, as in training); otherwise transformers, with a warning when ``use_vllm`` had to be dropped."""
    import importlib.util

    import torch

    if args.use_vllm and not torch.cuda.is_available():
        logger.warning("use_vllm is set but this machine has no CUDA GPU: evaluating with transformers instead.")
    elif args.use_vllm:
        if importlib.util.find_spec("vllm") is None:
            raise ImportError("use_vllm=True needs the vllm package: pip install 'taspo-trl[vllm]', or set --use_vllm false.")
        return VLLMEvalGenerator(model, tokenizer, args)
    return transformers_generator(model, tokenizer, args)


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
    e.g. with a vLLM-backed generator or a scripted policy. An environment call that takes longer than
    ``args.env_step_timeout`` ends its episode as failed, with a logged warning.
    """
    import torch

    from .envs.base import PromptTemplate, task_spec_from_row
    from .privileged.skillbank import SkillBank, add_skill_guidance
    from .rollout.chat import ChatFormat
    from .rollout.env_pool import EnvPool
    from .rollout.loop import run_agent_loop

    chat = ChatFormat(tokenizer)
    skills = SkillBank.load(args.prompt_skill_bank) if args.prompt_skill_bank else None
    generator = generate or transformers_generator(model, tokenizer, args)
    template = PromptTemplate(history_window=args.history_window)
    pool = EnvPool(env_factory, num_workers=args.num_env_workers, step_timeout=args.env_step_timeout)
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
                on_turn=lambda turn, live: print(  # called within this batch only, so start and began are its own
                    f"[taspo-eval] episodes from {start + 1}: turn {turn} played, {live} still playing "
                    f"({time.perf_counter() - began:.0f}s)", flush=True),
            )
            done = trajectories[-len(batch) :]
            errors = sum(_had_fault(t) for t in done)
            print(
                f"[taspo-eval] episodes {start + len(batch)}/{len(rows)}: success "
                f"{sum(t.won for t in done)}/{len(batch)}, environment errors {errors}/{len(batch)} "
                f"in {time.perf_counter() - began:.0f}s",
                flush=True,
            )
    finally:
        pool.shutdown()
    return trajectories


def _split_rows(split: str, args: EvalArguments, script_args: Any) -> list[dict[str, Any]]:
    from .envs import build_task_rows
    from .script_args import with_env_kwargs

    settings = asdict(script_args)
    if args.environment == "alfworld":
        settings.update(games_dir=str(Path(args.games_root) / split), games_split=split)
    else:
        settings.update(task_split=split)
    return with_env_kwargs(build_task_rows(args.environment, settings, args.max_turns), script_args.env_kwargs)


@dataclass
class EvalSetup:
    """What ``prepare_evaluation`` checked and loaded; from here on a fault ends an episode, not the evaluation."""

    env_factory: Any
    split_rows: dict[str, list[dict[str, Any]]]
    model: Any
    tokenizer: Any
    generate: Any


def prepare_evaluation(args: EvalArguments, script_args: Any) -> EvalSetup:
    """Check the inputs, cheapest first (model reference, splits, task rows), then load the model and its
    generator. Bad input raises one of ``SETUP_ERRORS`` naming the fix before any episode is played."""
    import torch

    from .envs import get_env_factory
    from .models import check_model_reference, load_model_and_tokenizer
    from .warmstart import resolve_policy_path

    check_model_reference(args.model_name_or_path)  # seconds, where building the games first takes minutes
    splits = args.splits or DEFAULT_SPLITS.get(args.environment)
    if not splits:
        raise ValueError(f"name the splits to evaluate for environment {args.environment!r} (--splits).")
    env_factory = get_env_factory(args.environment)
    split_rows = {split: _split_rows(split, args, script_args) for split in splits}
    model, tokenizer = load_model_and_tokenizer(
        resolve_policy_path(args.model_name_or_path, bf16=args.bf16), dtype=getattr(torch, args.dtype), device=args.device
    )
    return EvalSetup(env_factory, split_rows, model, tokenizer, build_generator(model, tokenizer, args))


def run_evaluation(args: EvalArguments, script_args: Any, setup: EvalSetup | None = None) -> list[dict[str, Any]]:
    """Evaluate every split; writes one JSON per split (the figures, with the decoding and turn settings and the
    versions), one JSONL per split (an episode a line), ``results.csv`` and ``results.md``; returns the result
    dicts."""
    from .reporting import PAPER_ENVS, render_groups_table, render_results_table, render_steps_table

    setup = setup or prepare_evaluation(args, script_args)
    label = args.label or Path(args.model_name_or_path).name
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for split, rows in setup.split_rows.items():
        print(f"[taspo-eval] {args.environment}/{split}: {len(rows)} tasks, model={args.model_name_or_path}, "
              f"precision: {args.precision.description}", flush=True)
        trajectories = evaluate_rows(rows, setup.model, setup.tokenizer, args, setup.env_factory, setup.generate)
        result = {
            "env": args.environment,
            "model": args.model_name_or_path,
            "method": label,
            "split": split,
            "num_tasks": len(rows),
            "seed": args.seed,
            "temperature": args.temperature,
            "settings": {name: getattr(args, name) for name in _RECORDED_SETTINGS},
            "versions": package_versions(("taspo-trl", "trl", "transformers", "torch")),
            **summarize(trajectories),
        }
        path = out_dir / f"{args.environment}_{split}.json"
        episodes = out_dir / f"{args.environment}_{split}_episodes.jsonl"
        episodes.write_text("".join(json.dumps(episode_record(t)) + "\n" for t in trajectories))
        overall = result["overall"]
        if overall["n"] and overall["errors"] == overall["n"]:
            first = next((t.error or "; ".join(getattr(t, "faults", [])) for t in trajectories), "")
            raise AllEpisodesFailed(
                f"all {overall['n']} episodes of {args.environment}/{split} failed with an environment error (the "
                f"first: {first[:300]}); no success rate is reported for them. The episodes, with their errors, "
                f"are in {episodes}; fix the environment (or its server) and evaluate again."
            )
        if overall["errors"]:
            print(f"[taspo-eval] {args.environment}/{split}: {overall['errors']} of {overall['n']} episodes failed "
                  "with an environment error and count as failures (their errors are in the episodes file)", flush=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"[taspo-eval] wrote {path} and {episodes.name}", flush=True)
        results.append(result)
    table = "Success rate (%):\n\n" + (render_results_table if args.environment in PAPER_ENVS else render_groups_table)(results)
    if args.environment == "alfworld":  # Table 4: mean steps of the successful episodes
        table += "\n\nMean steps of successful episodes:\n\n" + render_steps_table(results)
    (out_dir / "results.md").write_text(table + "\n")
    write_results_csv(results, out_dir / "results.csv")
    print(table, flush=True)
    return results


# The decoding and turn settings an evaluation result records, so that a table can say how it was played.
_RECORDED_SETTINGS = (
    "layout", "history_window", "max_turns", "max_prompt_tokens", "max_completion_length", "temperature", "top_p",
    "top_k", "min_p", "repetition_penalty", "generation_kwargs", "seed", "bf16", "dtype", "use_vllm",
    "prompt_skill_bank", "prompt_skill_top_k",
)


def episode_record(trajectory: Any) -> dict[str, Any]:
    """One line of the per-episode JSONL: which task, how it ended, and the actions taken."""
    return {
        "task": trajectory.task,
        "task_type": trajectory.task_type,
        "won": trajectory.won,
        "reward": trajectory.reward,
        "num_turns": trajectory.num_turns,
        "truncated": trajectory.truncated,
        "error": trajectory.error,
        "faults": list(getattr(trajectory, "faults", [])),
        "actions": [turn.action for turn in trajectory.turns],
    }


def write_results_csv(results: list[dict[str, Any]], path: Path) -> None:
    """One row per (result, group) and one per result's overall figures: method, split, group, n, success and its
    95 % interval, mean score, mean steps of successful episodes, seed."""
    import csv

    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["method", "env", "split", "group", "n", "success", "success_low_95", "success_high_95",
                         "score", "mean_steps_success", "seed"])
        for result in results:
            entries = [*result["groups"].items(), ("all", result["overall"])]
            for group, entry in entries:
                low, high = entry["success_interval_95"]
                writer.writerow([result["method"], result["env"], result["split"], group, entry["n"], entry["success"],
                                 low, high, entry["score"], entry["mean_steps_success"], result["seed"]])


def _parse_eval_args(argv: list[str]) -> tuple[EvalArguments, Any]:
    from trl import TrlParser

    from .script_args import AgentScriptArguments, check_setting_names, import_env_module, resolve_config_argv

    argv = resolve_config_argv(argv, "taspo-eval")
    parser = TrlParser((AgentScriptArguments, EvalArguments), allow_abbrev=False)
    check_setting_names(parser, argv, check_recipe=False)  # a training recipe's other keys are ignored here
    script_args, args, _ignored_recipe_keys, unknown = parser.parse_args_and_config(
        args=argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    if unknown:
        raise SystemExit(f"taspo-eval: unknown arguments {unknown}; see taspo-eval --help.")
    import_env_module(script_args.env_module, "taspo-eval")
    return args, script_args


def eval_main(argv: list[str] | None = None) -> None:
    """``taspo-eval``: parse flags (and an optional recipe), check and load everything, evaluate, print the
    table. A setup error is one line (``--debug`` shows its traceback)."""
    from .script_args import SETUP_ERRORS, one_line_errors

    argv, fail = one_line_errors("taspo-eval", list(sys.argv[1:] if argv is None else argv))
    try:
        args, script_args = _parse_eval_args(argv)
        logging.basicConfig(level=logging.WARNING)
        setup = prepare_evaluation(args, script_args)
    except SETUP_ERRORS as error:
        fail(error)
    try:
        run_evaluation(args, script_args, setup)
    except AllEpisodesFailed as error:
        fail(error)

if __name__ == "__main__":
    eval_main()
