"""Learning curves: GRPO, TASPO, AlignOPSD and GiGPO trained from the same warm start with the same seeds on train
games the warm start never saw, each evaluated every k optimizer steps on the same fixed ``eval_unseen`` ALFWorld
games with the same sampling seed; success with 95 % intervals that resample seeds and games, and each method's
paired difference from GRPO.

Every run is the ALFWorld quickstart recipe of its method (``recipes/quickstart/alfworld_<method>_cpu.yaml``),
built by ``taspo-train``'s own ``build_trainer`` with the setting's command-line overrides, so the curves use
exactly the settings a user trains with. A ``TrainerCallback`` evaluates at step 0 (the warm start) and after
every k-th step inside the one ``trainer.train()`` call, so the optimizer state carries across evaluations.

    python benchmarks/learning_curve.py --setting cpu                         # every method and seed (many hours)
    python benchmarks/learning_curve.py --setting cpu --methods grpo --seeds 0 1 --out parts/a   # one part
    python benchmarks/learning_curve.py --merge parts/a parts/b --out merged  # parts from other runs or machines
    python benchmarks/learning_curve.py --report merged                       # redo the statistics and the figure
    python benchmarks/learning_curve.py --setting gpu                         # one GPU: vLLM colocated
    python benchmarks/learning_curve.py --methods grpo --seeds 0 --steps 20 --eval-every 5 --set \
        gradient_accumulation_steps 32 --out parts/pilot      # a pilot: its own size, 8 tasks x 4 a step

Settings: ``smoke`` (tiny model, one game; the tests), ``cpu`` (the four methods, three seeds, fresh train games,
60 evaluation games) and ``gpu`` (the same methods, seeds and evaluation games, bigger batches, vLLM rollouts).

Runs in parts. An output folder (a *part*) holds ``part.json`` (what its runs share: the setting, the warm start's
fingerprint, a hash of the package's code and the recipes, the library versions, the precision, the evaluation
games; and the provenance of every invocation), ``runs/<method>_seed<seed>.json`` (each evaluation with every
game's outcome, and the wall time of each segment of the run) and ``train/<method>_seed<seed>/checkpoint-N``
(saved at every evaluation). Invoked again on the same folder it resumes every unfinished run from the checkpoint
of its last evaluation (a cut-off checkpoint is skipped for the one before it) and skips finished runs; it refuses a
folder whose runs differ from the invocation in code, warm start or settings, and says which. ``--merge`` puts the
runs of several parts together under the same check.

Statistics (``--report`` recomputes them): success per method and evaluation with a 95 % interval from a bootstrap
that resamples training seeds and evaluation games; each method's paired difference from GRPO (same seeds, same
games) at the last evaluation and in the area under the curve (the trapezoid mean of success over the steps);
and the difference a run of this size can detect, from the spread of the per-seed success between seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from taspo_trl.checkpoints import find_resumable
from taspo_trl.cli import build_trainer
from taspo_trl.envs import get_env_factory
from taspo_trl.envs.alfworld import TASK_TYPES, find_game_files, generate_games, task_spec_rows
from taspo_trl.evaluation import EvalArguments, evaluate_rows, summarize
from taspo_trl.precision import choose_precision
from taspo_trl.provenance import package_versions, provenance, source_commit
from taspo_trl.warmstart import FRESH_GAMES_SEED, resolve_policy_path

ROOT = Path(__file__).resolve().parent.parent
WARM_START = "embedded:smollm2-135m-alfworld"  # taspo_trl.warmstart: the embedded model after SFT on walkthroughs
# A sampled evaluation (``eval_temperature`` > 0) draws with this seed, reset before every evaluation, so every
# method and seed is measured on the same games with the same random stream.
EVAL_SEED = 0
EVAL_GAMES_SEED = 0
RESAMPLES = 4000
BOOTSTRAP_SEED = 0
# 80 % power for a two-sided test at the 5 % level: the smallest true difference that is detected 4 times in 5
# is (1.96 + 0.84) standard errors of the measured difference.
DETECTABLE_SES = 2.80
VERSIONED = ("torch", "transformers", "trl", "peft", "textworld", "alfworld")


@dataclass(frozen=True)
class Setting:
    """One size of the benchmark.

    Attributes:
        methods: credit methods to train (each uses ``recipes/quickstart/alfworld_<method>_cpu.yaml``).
        seeds: training seeds; every method trains once per seed.
        steps: optimizer steps per run (the learning-rate schedule runs over them).
        eval_every: evaluate after every ``eval_every``-th step (and at step 0 and the last step).
        eval_games_per_family: generated ``eval_unseen`` games per task family.
        eval_families: task families to evaluate on (all six when empty).
        eval_turns: turn cap of an evaluation episode.
        eval_temperature: sampling temperature of the evaluation; 0 decodes greedily, ``None`` samples at the
            training temperature (with ``EVAL_SEED``).
        train_games_per_type: generated train games per family, the pool each step draws its tasks from.
        train_games_seed: the seed of those games (the warm start trained on other seeds).
        overrides: ``taspo-train`` flags applied on top of the recipe.
        isolate: train each run in a child process (vLLM's colocated engine keeps its GPU memory until its
            process ends; a fresh process also starts every run from the same memory state).
    """

    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    eval_every: int
    eval_games_per_family: int
    eval_families: tuple[str, ...]
    eval_turns: int
    eval_temperature: float | None
    train_games_per_type: int
    train_games_seed: int
    overrides: tuple[str, ...]
    isolate: bool


METHODS = ("grpo", "taspo", "alignopsd", "gigpo")
SETTINGS: dict[str, Setting] = {
    # The tests: every code path (recipe build, callback, evaluation, checkpoints, report, plot) at the smallest size.
    "smoke": Setting(
        methods=METHODS,
        seeds=(0,),
        steps=2,
        eval_every=1,
        eval_games_per_family=1,
        eval_families=(TASK_TYPES[1], TASK_TYPES[3]),
        eval_turns=2,
        eval_temperature=0.0,
        train_games_per_type=1,
        train_games_seed=FRESH_GAMES_SEED,
        overrides=(
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
            "--max_turns", "2", "--max_completion_length", "8", "--max_tasks", "1", "--gradient_checkpointing",
            "false",
        ),
        isolate=False,
    ),
    # The quickstart recipes (2 tasks x 4 siblings a step, lr 1e-5, 12 turns of 48 tokens) on a pool of 120 fresh
    # train games (20 per family, so nearly every step plays new games) for 40 steps, evaluated every 10 steps
    # on 60 eval_unseen games (10 per family: one game is 1.7 points). A GRPO run takes about 45 minutes on a
    # 2-core CPU with bf16 (AlignOPSD's steps about 1.7 times GRPO's); the twelve runs about 11 hours, in parts.
    "cpu": Setting(
        methods=METHODS,
        seeds=(0, 1, 2),
        steps=40,
        eval_every=10,
        eval_games_per_family=10,
        eval_families=(),
        eval_turns=12,
        # Greedy: at T = 1 the pilot's two GRPO seeds disagreed on 25 of the 60 games at every evaluation while
        # their success barely moved, sampling noise that the paired differences carry in full. The greedy action
        # is a function of the weights, so seeds and methods differ only where their policies do.
        eval_temperature=0.0,
        train_games_per_type=20,
        train_games_seed=FRESH_GAMES_SEED,
        overrides=(),
        isolate=True,
    ),
    # One GPU: 8 tasks x 8 siblings per step with vLLM rollouts (colocated), longer episodes and responses, the
    # same 60 evaluation games.
    "gpu": Setting(
        methods=METHODS,
        seeds=(0, 1, 2),
        steps=150,
        eval_every=10,
        eval_games_per_family=10,
        eval_families=(),
        eval_turns=30,
        eval_temperature=0.0,
        train_games_per_type=20,
        train_games_seed=FRESH_GAMES_SEED,
        overrides=(
            "--use_cpu", "false", "--bf16", "true", "--use_vllm", "true", "--vllm_mode", "colocate",
            "--vllm_gpu_memory_utilization", "0.3", "--num_generations", "8", "--per_device_train_batch_size",
            "8", "--gradient_accumulation_steps", "8", "--max_turns", "30", "--max_completion_length", "128",
            "--learning_rate", "1e-6",
        ),
        isolate=True,
    ),
}


# ---- what a part's runs share ------------------------------------------------------------------------------------


def code_sha256(methods: tuple[str, ...]) -> str:
    """SHA-256 over the package's Python files and the methods' recipes: the code a run trains with. (This
    script's statistics and plotting are left out; its training settings are in the setting.)"""
    digest = hashlib.sha256()
    files = sorted((ROOT / "taspo_trl").rglob("*.py")) + [
        ROOT / "recipes" / "quickstart" / f"alfworld_{method}_cpu.yaml" for method in sorted(methods)]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def model_identity(name: str, model_dir: str) -> dict[str, Any]:
    """The starting policy: a warm start's build fingerprint and training-data hash, else its weights' hash."""
    record = Path(model_dir) / "warm_start.json"
    if record.is_file():
        built = json.loads(record.read_text())
        return {"name": name, "fingerprint": built["fingerprint"], "data_sha256": built.get("data_sha256")}
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        digest.update(path.read_bytes())
    return {"name": name, "weights_sha256": digest.hexdigest()}


def _requested_bf16(overrides: tuple[str, ...]) -> bool | None:
    if "--bf16" in overrides:
        return overrides[overrides.index("--bf16") + 1].lower() == "true"
    return None


def games_sha256(rows: list[dict[str, Any]]) -> str:
    """SHA-256 over the games of ``rows`` (each game file's bytes and its path below its split's folder), so two
    parts that generated the same games in different folders agree."""
    digest = hashlib.sha256()
    for row in rows:
        game = Path(row["game_file"])
        digest.update("/".join(game.parts[-3:]).encode() + b"\0" + game.read_bytes() + b"\0")
    return digest.hexdigest()


def identity(setting_name: str, setting: Setting, model: str, model_dir: str, eval_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything two runs must share to be compared or pooled (the methods and seeds excepted)."""
    config = {key: value for key, value in asdict(setting).items() if key not in ("methods", "seeds", "isolate")}
    return json.loads(json.dumps({
        "setting": setting_name,
        "config": config,
        "warm_start": model_identity(model, model_dir),
        "code_sha256": code_sha256(setting.methods),
        "versions": package_versions(VERSIONED),
        "bf16": choose_precision(_requested_bf16(setting.overrides), use_cpu="--use_cpu" not in setting.overrides).bf16,
        "eval_games_sha256": games_sha256(eval_rows),
        "eval_games": len(eval_rows),
        "eval_seed": EVAL_SEED,
    }))


def identity_differences(expected: dict[str, Any], found: dict[str, Any], prefix: str = "") -> list[str]:
    """The keys (dotted) whose values differ between two identities, with both values."""
    differences = []
    for key in sorted(set(expected) | set(found)):
        a, b = expected.get(key), found.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            differences += identity_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            differences.append(f"{prefix}{key}: {json.dumps(a)} vs {json.dumps(b)}")
    return differences


class PartMismatch(ValueError):
    """Runs that differ in code, warm start or settings: they can't be resumed or pooled together."""


def open_part(out: Path, wanted: dict[str, Any], invocation: dict[str, Any] | None) -> dict[str, Any]:
    """``out/part.json``, with ``invocation`` added unless it is ``None``; a new part if there is none. Raises
    ``PartMismatch`` when the folder holds runs of another identity."""
    path = out / "part.json"
    if path.is_file():
        part = json.loads(path.read_text())
        differences = identity_differences(part["identity"], wanted)
        if differences:
            raise PartMismatch(
                f"{out} holds runs that differ from this invocation in: {'; '.join(differences)} (theirs vs this "
                "one's). Continue them with the code, warm start and settings they began with, or give another --out.")
    else:
        part = {"identity": wanted, "invocations": []}
    if invocation is not None:
        part["invocations"].append(invocation)
    write_json(path, part)
    return part


# ---- training and evaluation --------------------------------------------------------------------------------------


class CurveRecorder(TrainerCallback):
    """Evaluates the policy on fixed games at step 0 (unless ``start`` > 0: a resumed run), every ``every`` steps
    and at the last step, and hands each point to ``on_point``. One process only: every process of a
    multi-process launch would evaluate. ``first_point`` may return step 0's point measured before (every run
    starts from the same policy), or ``None``."""

    def __init__(self, rows: list[dict[str, Any]], max_turns: int, every: int, on_point: Any, start: int = 0,
                 first_point: Any = None, temperature: float | None = None):
        self.rows = rows
        self.max_turns = max_turns
        self.temperature = temperature
        self.every = every
        self.on_point = on_point
        self.start = start
        self.first_point = first_point or (lambda: None)
        self.eval_args: EvalArguments | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, processing_class: Any = None,
                       **kwargs: Any) -> None:
        # Decoding as in training (layout, prompt window, response length, bf16 autocast; the temperature unless
        # the setting fixes one), so the curve measures the policy that is being trained; all episodes in one batch.
        self.eval_args = EvalArguments(
            layout=args.layout,
            history_window=args.history_window,
            max_turns=self.max_turns,
            max_prompt_tokens=args.max_prompt_tokens,
            max_completion_length=args.max_completion_length,
            temperature=args.temperature if self.temperature is None else self.temperature,
            top_p=args.top_p,
            seed=EVAL_SEED,
            eval_batch_size=len(self.rows),
            bf16=args.bf16,
        )
        if self.start == 0:
            self.on_point(self.first_point() or self._evaluate(0, args.environment, model, processing_class))

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, processing_class: Any = None,
                    **kwargs: Any) -> None:
        if state.global_step > self.start and (state.global_step % self.every == 0
                                               or state.global_step == state.max_steps):
            self.on_point(self._evaluate(state.global_step, args.environment, model, processing_class))
            control.should_save = True  # the checkpoint a stopped run resumes from

    def _evaluate(self, step: int, environment: str, model: Any, tokenizer: Any) -> dict[str, Any]:
        began = time.perf_counter()
        # evaluate_rows reseeds torch; forking the RNG keeps training's own random stream untouched, so a run
        # samples the same rollouts whatever its evaluation schedule.
        devices = list(range(torch.cuda.device_count()))
        with torch.random.fork_rng(devices=devices):
            trajectories = evaluate_rows(self.rows, model, tokenizer, self.eval_args, get_env_factory(environment))
        turns = [turn for trajectory in trajectories for turn in trajectory.turns]
        summary = summarize(trajectories)
        return {
            "step": step,
            "success": summary["overall"]["success"],
            "outcomes": [int(trajectory.won) for trajectory in trajectories],
            "valid_action_rate": sum(turn.action_valid for turn in turns) / len(turns) if turns else 0.0,
            "success_per_family": {family: stats["success"] for family, stats in summary["groups"].items()},
            "eval_seconds": round(time.perf_counter() - began, 1),
        }


def write_json(path: Path, value: Any) -> None:
    """Write through a temporary file and a rename, so whoever polls the file never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(value, indent=2))
    os.replace(staging, path)


def _read_run(path: Path, method: str, seed: int) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    return {"method": method, "seed": seed, "points": [], "segments": [], "done": False}


def _resume_point(run: dict[str, Any], train_dir: Path) -> tuple[Path | None, int]:
    """The checkpoint to resume from and its step (0: start over), the run's points cut back to it. A checkpoint
    without its evaluation recorded (stopped between the two) or an evaluation without its checkpoint are redone."""
    checkpoint, skipped = find_resumable(train_dir)
    for folder, problem in skipped:
        print(f"[learning-curve] skipping {folder}: {problem}", flush=True)
    recorded = {point["step"] for point in run["points"]}
    step = int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint else 0
    if checkpoint and step not in recorded:
        checkpoint, step = None, 0  # no evaluation of it: begin again rather than leave a hole in the curve
    dropped = [point["step"] for point in run["points"] if point["step"] > step]
    if dropped:
        print(f"[learning-curve] {run['method']} seed {run['seed']}: redoing steps {step}..{max(dropped)} "
              f"(evaluations at {dropped} have no checkpoint)", flush=True)
    run["points"] = [point for point in run["points"] if point["step"] <= step] if checkpoint else \
        [point for point in run["points"] if point["step"] == 0]
    return checkpoint, step


def train_one(method: str, seed: int, setting: Setting, model: str, out: Path, eval_rows: list[dict[str, Any]],
              invocation: dict[str, Any]) -> None:
    """Train one method with one seed, or resume it from its last evaluation, recording its curve to
    ``out/runs`` after every evaluation."""
    run_file = out / "runs" / f"{method}_seed{seed}.json"
    run = _read_run(run_file, method, seed)
    if run["done"]:
        print(f"[learning-curve] {method} seed {seed}: finished before, skipped", flush=True)
        return
    train_dir = out / "train" / f"{method}_seed{seed}"
    checkpoint, start = _resume_point(run, train_dir)
    segment = {"from_step": start, "to_step": start, "wall_seconds": 0.0, "invocation": invocation}
    run["segments"].append(segment)
    began = time.perf_counter()
    shared_first = out / "step0.json"

    def first_point() -> dict[str, Any] | None:
        recorded = [point for point in run["points"] if point["step"] == 0]
        if recorded:
            return recorded[0]
        return json.loads(shared_first.read_text()) if shared_first.is_file() else None

    def record(point: dict[str, Any]) -> None:
        if point["step"] == 0 and not shared_first.is_file():
            write_json(shared_first, point)
        if not any(p["step"] == point["step"] for p in run["points"]):
            run["points"].append(point)
            print(f"[learning-curve] {method} seed {seed} step {point['step']}: success {point['success']:.3f} "
                  f"valid {point['valid_action_rate']:.2f} ({point['eval_seconds']:.0f} s)", flush=True)
        segment["to_step"] = point["step"]
        segment["wall_seconds"] = round(time.perf_counter() - began, 1)
        run["done"] = point["step"] == setting.steps
        write_json(run_file, run)

    argv = [
        "--config", str(ROOT / "recipes" / "quickstart" / f"alfworld_{method}_cpu.yaml"),
        "--max_steps", str(setting.steps),
        "--seed", str(seed),
        "--output_dir", str(train_dir),
        "--games_dir", str(out / "games" / "train"),
        "--games_per_type", str(setting.train_games_per_type),
        "--games_seed", str(setting.train_games_seed),
        # a checkpoint at every evaluation (the callback asks for it), the last one kept
        "--save_strategy", "steps", "--save_steps", str(10**9), "--save_total_limit", "1",
        *(["--resume_from_checkpoint", str(checkpoint)] if checkpoint else ["--overwrite_output_dir", "true"]),
        *setting.overrides,
    ]
    if checkpoint:
        print(f"[learning-curve] {method} seed {seed}: resuming from {checkpoint}", flush=True)
    recorder = CurveRecorder(eval_rows, setting.eval_turns, setting.eval_every, record, start, first_point,
                             setting.eval_temperature)
    trainer = build_trainer(argv, callbacks=[recorder], model_override=model)
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    finally:
        trainer.close()
    segment["wall_seconds"] = round(time.perf_counter() - began, 1)
    write_json(run_file, run)


def eval_game_rows(setting: Setting, out: Path) -> list[dict[str, Any]]:
    """The fixed ``eval_unseen`` games (generated once, seed ``EVAL_GAMES_SEED``) as dataset rows."""
    games_dir = out / "games" / "eval_unseen"
    families = list(setting.eval_families or TASK_TYPES)
    files = find_game_files(games_dir) if games_dir.exists() else []
    if not files:
        files = generate_games(games_dir, setting.eval_games_per_family, EVAL_GAMES_SEED, "eval_unseen",
                               task_types=families)
    return task_spec_rows(sorted(files))


# ---- statistics ---------------------------------------------------------------------------------------------------


def _replicates(outcomes: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap means of a (seeds, games) array, resampling the seeds and, independently, the games (the same game
    draw for every seed of a replicate)."""
    rng = np.random.default_rng(seed)
    n_seeds, n_games = outcomes.shape
    seed_draws = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    game_draws = rng.integers(0, n_games, size=(resamples, n_games))
    return np.array([outcomes[np.ix_(s, g)].mean() for s, g in zip(seed_draws, game_draws)])


def bootstrap_mean(outcomes: np.ndarray, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """Mean of a (seeds, games) array with its 95 % percentile interval from a bootstrap that resamples the seeds
    and the games."""
    outcomes = np.asarray(outcomes, dtype=float)
    low, high = np.percentile(_replicates(outcomes, resamples, seed), [2.5, 97.5])
    return {"mean": float(outcomes.mean()), "low": float(low), "high": float(high)}


def paired_difference(method: np.ndarray, baseline: np.ndarray, resamples: int = RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """``method`` minus ``baseline``, two (seeds, games) arrays of the same training seeds (row for row) and
    evaluation games: the mean difference and its bootstrap interval, seeds and games resampled together for both."""
    return bootstrap_mean(np.asarray(method, dtype=float) - np.asarray(baseline, dtype=float), resamples, seed)


def area_under_curve(steps: list[int], outcomes: np.ndarray) -> np.ndarray:
    """Per (seed, game): the trapezoid mean of the outcome over the evaluated steps, ``outcomes`` shaped (steps,
    seeds, games); 1 for a game won at every evaluation, whatever the step spacing."""
    outcomes = np.asarray(outcomes, dtype=float)
    widths = np.diff(np.asarray(steps, dtype=float))
    heights = (outcomes[1:] + outcomes[:-1]) / 2
    return np.tensordot(widths, heights, axes=1) / widths.sum()


def detectable_difference(null_pairs: list[np.ndarray], seeds: int, resamples: int = RESAMPLES) -> float | None:
    """The paired difference from GRPO that a run with ``seeds`` seeds per method detects 4 times in 5 (80 % power,
    5 % level), from ``null_pairs``: per-game differences between two finished seeds of one method, which is what
    a paired difference between two methods with no effect looks like. Their standard error under this
    benchmark's bootstrap, scaled from their number of pairs to ``seeds`` (assuming independent seeds), times
    2.8. ``None`` without two finished seeds of any method."""
    if not null_pairs:
        return None
    spread = _replicates(np.asarray(null_pairs, dtype=float), resamples, BOOTSTRAP_SEED).std()
    return float(DETECTABLE_SES * spread * np.sqrt(len(null_pairs) / seeds))


def _verdict(interval: dict[str, float]) -> str:
    if interval["low"] > 0:
        return "better than GRPO"
    if interval["high"] < 0:
        return "worse than GRPO"
    return "no detectable difference"


def curve_statistics(runs: list[dict[str, Any]], full_seeds: int, resamples: int = RESAMPLES) -> dict[str, Any]:
    """Over the finished runs (an unfinished one is only drawn): per method, success at every evaluation with its
    interval; against GRPO, the paired difference at the last evaluation and in the area under the curve, on the
    seeds both finished; and the detectable difference for ``full_seeds`` seeds, with the degrees of freedom of
    the spread it comes from."""
    by_method: dict[str, dict[int, dict[int, list[int]]]] = {}
    for run in (run for run in runs if run["done"]):
        by_method.setdefault(run["method"], {})[run["seed"]] = {p["step"]: p["outcomes"] for p in run["points"]}
    methods: dict[str, Any] = {}
    for method, seeds in by_method.items():
        steps = sorted(set.intersection(*(set(points) for points in seeds.values())))
        table = [{"step": step, "seeds": len(seeds),
                  **bootstrap_mean(np.array([seeds[s][step] for s in sorted(seeds)]), resamples)} for step in steps]
        methods[method] = {"steps": steps, "success": table}
        if len(steps) > 1:  # did training move it? the last evaluation against the first, paired by seed and game
            by_step = {step: np.array([seeds[s][step] for s in sorted(seeds)]) for step in (steps[0], steps[-1])}
            change = paired_difference(by_step[steps[-1]], by_step[steps[0]], resamples)
            moved = "up" if change["low"] > 0 else "down" if change["high"] < 0 else "no detectable change"
            methods[method]["change"] = {**change, "from_step": steps[0], "to_step": steps[-1], "verdict": moved}
    baseline = by_method.get("grpo")
    for method, seeds in by_method.items():
        if method == "grpo" or not baseline:
            continue
        shared = sorted(set(seeds) & set(baseline))
        steps = sorted(set.intersection(*(set(seeds[s]) & set(baseline[s]) for s in shared))) if shared else []
        if len(steps) < 2:
            continue
        ours = np.array([[seeds[s][step] for s in shared] for step in steps])
        theirs = np.array([[baseline[s][step] for s in shared] for step in steps])
        last = paired_difference(ours[-1], theirs[-1], resamples)
        auc = paired_difference(area_under_curve(steps, ours), area_under_curve(steps, theirs), resamples)
        methods[method]["against_grpo"] = {
            "seeds": shared, "last_step": steps[-1],
            "last": {**last, "verdict": _verdict(last)},
            "auc": {**auc, "verdict": _verdict(auc)},
        }
    # two seeds of one method differ only by chance: per-game differences at the last evaluation and in the area
    last_pairs, auc_pairs = [], []
    for method, seeds in by_method.items():
        steps = methods[method]["steps"]
        if len(steps) < 2:
            continue
        curves = np.array([[points[step] for points in seeds.values()] for step in steps], dtype=float)
        areas = area_under_curve(steps, curves)
        for i in range(len(seeds)):
            for j in range(i + 1, len(seeds)):
                last_pairs.append(curves[-1, i] - curves[-1, j])
                auc_pairs.append(areas[i] - areas[j])
    return {
        "methods": methods,
        "detectable_difference": {"seeds": full_seeds, "last": detectable_difference(last_pairs, full_seeds, resamples),
                                  "auc": detectable_difference(auc_pairs, full_seeds, resamples),
                                  "seed_pairs": len(last_pairs)},
        "bootstrap": {"resamples": resamples, "seed": BOOTSTRAP_SEED, "unit": "training seeds and evaluation games"},
    }


# ---- reports and parts --------------------------------------------------------------------------------------------


def read_runs(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((folder / "runs").glob("*_seed*.json"))]


def write_report(out: Path, resamples: int = RESAMPLES) -> dict[str, Any]:
    """``learning_curve.json`` (the part's identity and invocations, every run, the statistics) and
    ``learning_curve.png`` from the runs under ``out``."""
    part = json.loads((out / "part.json").read_text())
    runs = [run for run in read_runs(out) if run["points"]]
    setting = SETTINGS[part["identity"]["setting"]]
    statistics = curve_statistics(runs, len(setting.seeds), resamples)
    invocations = part["invocations"]
    # the results page's provenance block: the last invocation, and every invocation whose runs the report holds
    provenance_block = {**invocations[-1], **({"merged_from": [{**i, "pooling": "the runs"} for i in invocations]}
                                              if len(invocations) > 1 else {})}
    report = {**part, "planned": {"methods": list(setting.methods), "seeds": list(setting.seeds)},
              "provenance": provenance_block, "runs": runs, **statistics}
    write_json(out / "learning_curve.json", report)
    plot(report, out / "learning_curve.png")
    return report


def load_part(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A part's ``part.json`` and runs: from its folder, or from a report it or a merge wrote (a
    ``learning_curve.json``, such as the one under ``benchmarks/results``), which holds both."""
    if path.is_file():
        report = json.loads(path.read_text())
        return {"identity": report["identity"], "invocations": report["invocations"]}, report["runs"]
    return json.loads((path / "part.json").read_text()), read_runs(path)


def merge_parts(parts: list[Path], out: Path) -> dict[str, Any]:
    """Put the runs of ``parts`` (folders or reports) into ``out`` (a new part) after checking that every part has
    the first one's identity; a run (method, seed) in two parts must be the same run. Raises ``PartMismatch``
    otherwise."""
    loaded = [(path, *load_part(path)) for path in parts]
    first_path, first, _ = loaded[0]
    for path, part, _ in loaded[1:]:
        differences = identity_differences(first["identity"], part["identity"])
        if differences:
            raise PartMismatch(f"{path} differs from {first_path} in: {'; '.join(differences)} ({first_path}'s vs "
                               f"{path}'s); runs that differ in code, warm start or settings are not pooled.")
    runs: dict[tuple[str, int], tuple[Path, dict[str, Any]]] = {}
    for path, _, part_runs in loaded:
        for run in part_runs:
            key = (run["method"], run["seed"])
            if key in runs and runs[key][1]["points"] != run["points"]:
                raise PartMismatch(f"{key[0]} seed {key[1]} is in {runs[key][0]} and in {path} with other "
                                   "evaluations: keep one of them out of the merge.")
            runs[key] = (path, run)
    merged = {"identity": first["identity"],
              "invocations": list({json.dumps(i, sort_keys=True): i for _, part, _ in loaded
                                   for i in part["invocations"]}.values()),
              "merged_from": [str(path) for path, _, _ in loaded]}
    write_json(out / "part.json", merged)
    for (method, seed), (path, run) in runs.items():  # a run keeps the part it was first merged from
        write_json(out / "runs" / f"{method}_seed{seed}.json", {"part": str(path), **run})
    return merged


def plot(report: dict[str, Any], path: Path) -> None:
    """One panel per method (each seed thin, the mean thick, its 95 % interval shaded) and one of the paired
    differences from GRPO with their intervals."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    present = set(report["methods"]) | set(report.get("planned", {}).get("methods", []))
    methods = [m for m in METHODS if m in present] + sorted(present - set(METHODS))
    panels = len(methods) + 1
    columns = min(panels, 3)
    rows = -(-panels // columns)
    figure = Figure(figsize=(4.2 * columns, 3.6 * rows), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    games = report["identity"]["eval_games"]
    for k, method in enumerate(methods):
        ax, color = axes[k], f"C{k}"
        for run in (r for r in report["runs"] if r["method"] == method):
            ax.plot([p["step"] for p in run["points"]], [p["success"] for p in run["points"]], color=color,
                    alpha=0.4, linewidth=1)
        ax.set_title(method)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(f"success, {games} eval_unseen games")
        if method not in report["methods"]:
            ax.text(0.5, 0.5, "no finished run yet", ha="center", va="center", transform=ax.transAxes)
            continue
        table = report["methods"][method]["success"]
        steps = [row["step"] for row in table]
        ax.fill_between(steps, [row["low"] for row in table], [row["high"] for row in table], color=color, alpha=0.2)
        seeds = table[0]["seeds"] if table else 0
        ax.plot(steps, [row["mean"] for row in table], color=color, linewidth=2.5, marker="o",
                label=f"mean of {seeds} seed{'s' * (seeds != 1)}, 95 % interval")
        ax.legend(fontsize="small", loc="upper left")
    ax = axes[len(methods)]
    ax.axhline(0.0, color="black", linewidth=0.8)
    compared = [m for m in methods if "against_grpo" in report["methods"].get(m, {})]
    if not compared:
        ax.text(0.5, 0.5, "no method paired with GRPO yet", ha="center", va="center", transform=ax.transAxes)
    for x, method in enumerate(compared):
        against, color = report["methods"][method]["against_grpo"], f"C{methods.index(method)}"
        for offset, (what, marker, label) in zip((-0.15, 0.15), (("last", "o", "last evaluation"),
                                                                 ("auc", "s", "area under the curve"))):
            cell = against[what]
            ax.errorbar([x + offset], [cell["mean"]], yerr=[[cell["mean"] - cell["low"]], [cell["high"] - cell["mean"]]],
                        color=color, marker=marker, capsize=4, linestyle="none", label=label if x == 0 else None)
    ax.set_xticks(range(len(compared)), compared)
    ax.set_xlim(-0.6, max(len(compared), 1) - 0.4)
    ax.set_title("paired difference from GRPO, 95 % interval")
    ax.set_ylabel("difference in success")
    if compared:
        ax.legend(fontsize="small")
    for ax in axes[: len(methods)]:
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax = axes[len(methods)]
    ax.grid(alpha=0.3)
    for extra in axes[panels:]:
        extra.set_visible(False)
    figure.suptitle(f"learning curves, {report['identity']['setting']} setting, from {report['identity']['warm_start']['name']}")
    figure.tight_layout()
    figure.savefig(path, format="png")


def _print_summary(report: dict[str, Any]) -> None:
    for method, entry in report["methods"].items():
        print(f"[learning-curve] {method}: " + ", ".join(
            f"step {row['step']} {row['mean']:.3f} [{row['low']:.3f}, {row['high']:.3f}]" for row in entry["success"]),
            flush=True)
        if "against_grpo" in entry:
            against = entry["against_grpo"]
            print(f"[learning-curve] {method} - grpo, seeds {against['seeds']}: step {against['last_step']} "
                  f"{against['last']['mean']:+.3f} [{against['last']['low']:+.3f}, {against['last']['high']:+.3f}] "
                  f"({against['last']['verdict']}); area {against['auc']['mean']:+.3f} [{against['auc']['low']:+.3f}, "
                  f"{against['auc']['high']:+.3f}] ({against['auc']['verdict']})", flush=True)
    detectable = report["detectable_difference"]
    if detectable["last"] is not None:
        area = f" ({detectable['auc']:.3f} in the area under the curve)" if detectable["auc"] is not None else ""
        print(f"[learning-curve] with {detectable['seeds']} seeds a method, a difference from GRPO of "
              f"{detectable['last']:.3f} at the last evaluation{area} is detected 4 times in 5 (from "
              f"{detectable['seed_pairs']} pair(s) of seeds of one method)", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run, resume, merge or report; returns the report written to ``<out>/learning_curve.json``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=list(SETTINGS), default="cpu")
    parser.add_argument("--model", default=WARM_START, help="policy to start from (default: the warm start)")
    parser.add_argument("--out", help="output folder, one part (default: outputs/learning_curve/<setting>)")
    parser.add_argument("--methods", nargs="+", help="train only these of the setting's methods (a part)")
    parser.add_argument("--seeds", nargs="+", type=int, help="train only these of the setting's seeds (a part)")
    parser.add_argument("--set", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                        help="a taspo-train setting on top of the setting's (e.g. --set learning_rate 5e-5); it "
                             "enters the part's identity")
    parser.add_argument("--steps", type=int, help="optimizer steps of each run instead of the setting's (a pilot's "
                        "size); it enters the part's identity")
    parser.add_argument("--eval-every", type=int, help="evaluate every this many steps instead of the setting's; it "
                        "enters the part's identity")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="PART",
                        help="merge these parts (folders, or the learning_curve.json of one) into --out")
    parser.add_argument("--report", type=Path, metavar="PART", help="recompute the statistics and figure of a part")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap replicates for the intervals")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # "<method>:<seed>": one run, in a child process
    args = parser.parse_args(argv)

    if args.report:
        if not (args.report / "part.json").is_file():
            parser.error(f"--report {args.report}: no part.json there; give a folder this script wrote (--out or --merge)")
        report = write_report(args.report, args.resamples)
        _print_summary(report)
        return report
    out = Path(args.out or f"outputs/learning_curve/{args.setting}").resolve()
    if args.merge:
        if out.exists() and any(out.iterdir()):
            parser.error(f"--out {out} is not empty; merge into a new folder")
        try:
            merge_parts([path.resolve() for path in args.merge], out)
        except PartMismatch as error:
            raise SystemExit(f"learning_curve: {error}") from None
        report = write_report(out, args.resamples)
        _print_summary(report)
        return report

    for name, value in (("--steps", args.steps), ("--eval-every", args.eval_every)):
        if value is not None and value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    setting = SETTINGS[args.setting]
    setting = replace(setting, overrides=(*setting.overrides, *(item for key, value in args.set
                                                                 for item in (f"--{key}", value))),
                      steps=args.steps or setting.steps, eval_every=args.eval_every or setting.eval_every)
    unknown = sorted(set(args.methods or ()) - set(setting.methods)) + sorted(set(args.seeds or ()) - set(setting.seeds))
    if unknown:
        parser.error(f"not in the {args.setting} setting: {unknown} (methods {setting.methods}, seeds {setting.seeds})")
    chosen = replace(setting, methods=tuple(args.methods or setting.methods), seeds=tuple(args.seeds or setting.seeds))
    model = resolve_policy_path(args.model)
    eval_rows = eval_game_rows(setting, out)
    wanted = identity(args.setting, setting, args.model, model, eval_rows)
    invocation = {**provenance(argv, __file__, commit=source_commit(__file__)), "methods": list(chosen.methods),
                  "seeds": list(chosen.seeds)}
    try:
        part = open_part(out, wanted, None if args.only else invocation)
    except PartMismatch as error:
        raise SystemExit(f"learning_curve: {error}") from None
    if args.only:
        method, seed = args.only.split(":")
        train_one(method, int(seed), setting, model, out, eval_rows, part["invocations"][-1])
        return write_report(out, args.resamples)

    failed = []
    for seed in chosen.seeds:
        for method in chosen.methods:
            if setting.isolate:
                child = [sys.executable, __file__, "--setting", args.setting, "--model", args.model, "--out", str(out),
                         *(item for pair in args.set for item in ("--set", *pair)), "--steps", str(setting.steps),
                         "--eval-every", str(setting.eval_every), "--only", f"{method}:{seed}"]
                code = subprocess.run(child).returncode
                if code:  # the other runs go on; this one resumes from its last evaluation when rerun
                    failed.append(f"{method} seed {seed} (exit code {code})")
                    print(f"[learning-curve] {failed[-1]} failed; rerun the same command to resume it", flush=True)
            else:
                train_one(method, seed, setting, model, out, eval_rows, invocation)
    report = write_report(out, args.resamples)  # a child writes one after its run too, for whoever watches
    _print_summary(report)
    print(f"[learning-curve] wrote {out / 'learning_curve.json'} and {out / 'learning_curve.png'}", flush=True)
    if failed:
        raise SystemExit(f"learning_curve: {len(failed)} run(s) failed: {', '.join(failed)}; rerun to resume them")
    return report


if __name__ == "__main__":
    main()
