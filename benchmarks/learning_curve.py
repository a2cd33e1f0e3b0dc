"""Learning curves: GRPO, TASPO and AlignOPSD trained from the same warm start with the same seeds, each
evaluated every k optimizer steps on the same fixed ``eval_unseen`` ALFWorld games with the same sampling seed.

Every run is the ALFWorld quickstart recipe of its method (``recipes/quickstart/alfworld_<method>_cpu.yaml``),
built by ``taspo-train``'s own ``build_trainer`` with the setting's command-line overrides, so the curves use
exactly the settings a user trains with. A ``TrainerCallback`` evaluates at step 0 (the warm start) and after
every k-th step inside the one ``trainer.train()`` call, so the optimizer state carries across evaluations.

    python benchmarks/learning_curve.py --setting cpu --model ~/.cache/taspo_trl/models/smollm2-135m-alfworld
    python benchmarks/learning_curve.py --setting gpu    # one GPU: vLLM colocated, 3 seeds, all three methods

Settings: ``smoke`` (tiny model, one step, one game; the test), ``cpu`` (one seed of GRPO and TASPO, sized for
at most an hour on a 2-core machine; run it in the background) and ``gpu`` (three seeds of all three methods,
bigger batches, vLLM rollouts; one process, one GPU).

Outputs, in ``--out``: ``runs/<method>_seed<seed>.json`` per run, and ``learning_curve.json`` and
``learning_curve.png`` over all runs (success, and the valid-action rate, against step, per method, one thin
line per seed and a thick mean). All three are rewritten after every evaluation, so a run that is stopped
leaves its partial curves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from taspo_trl.cli import build_trainer
from taspo_trl.envs import get_env_factory
from taspo_trl.envs.alfworld import TASK_TYPES, find_game_files, generate_games, task_spec_rows
from taspo_trl.evaluation import EvalArguments, evaluate_rows, summarize
from taspo_trl.provenance import provenance
from taspo_trl.warmstart import resolve_policy_path

ROOT = Path(__file__).resolve().parent.parent
WARM_START = "embedded:smollm2-135m-alfworld"  # taspo_trl.warmstart: the embedded model after SFT on walkthroughs
# Evaluation samples at the training temperature with this seed, reset before every evaluation, so every
# method and seed is measured on the same games with the same random stream.
EVAL_SEED = 0
# The figure's panels: success, and the valid-action rate, which moves before success does.
PANELS = {"success": "success", "valid_action_rate": "valid-action rate"}


@dataclass(frozen=True)
class Setting:
    """One size of the benchmark.

    Attributes:
        methods: credit methods to train (each uses ``recipes/quickstart/alfworld_<method>_cpu.yaml``).
        seeds: training seeds; every method trains once per seed.
        steps: optimizer steps per run.
        eval_every: evaluate after every ``eval_every``-th step (and at step 0 and the last step).
        eval_games_per_family: generated ``eval_unseen`` games per task family.
        eval_families: task families to evaluate on (all six when empty).
        eval_turns: turn cap of an evaluation episode.
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
    overrides: tuple[str, ...]
    isolate: bool


SETTINGS: dict[str, Setting] = {
    # The test: every code path (recipe build, callback, evaluation, report, plot) at the smallest size.
    "smoke": Setting(
        methods=("grpo", "taspo"),
        seeds=(0,),
        steps=1,
        eval_every=1,
        eval_games_per_family=1,
        eval_families=(TASK_TYPES[0],),
        eval_turns=2,
        overrides=(
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
            "--max_turns", "2", "--max_completion_length", "8", "--max_tasks", "1", "--gradient_checkpointing",
            "false",
        ),
        isolate=False,
    ),
    # The quickstart recipes unchanged but for the step count: 8 steps play each of the 6 train tasks 2-3 times.
    # Evaluation on 2 games per family (the warm-start table's 12 eval_unseen games), so one game is 8 points.
    "cpu": Setting(
        methods=("grpo", "taspo"),
        seeds=(0,),
        steps=8,
        eval_every=2,
        eval_games_per_family=2,
        eval_families=(),
        eval_turns=12,
        overrides=(),
        isolate=True,
    ),
    # One GPU: 8 tasks x 8 siblings per step with vLLM rollouts (colocated), longer episodes and responses,
    # and 30 evaluation games, so one success is 3 percentage points rather than 17.
    "gpu": Setting(
        methods=("grpo", "taspo", "alignopsd"),
        seeds=(0, 1, 2),
        steps=150,
        eval_every=10,
        eval_games_per_family=5,
        eval_families=(),
        eval_turns=30,
        overrides=(
            "--use_cpu", "false", "--bf16", "true", "--use_vllm", "true", "--vllm_mode", "colocate",
            "--vllm_gpu_memory_utilization", "0.3", "--num_generations", "8", "--per_device_train_batch_size",
            "8", "--gradient_accumulation_steps", "8", "--games_per_type", "20", "--max_turns", "30",
            "--max_completion_length", "128", "--learning_rate", "1e-6",
        ),
        isolate=True,
    ),
}


class CurveRecorder(TrainerCallback):
    """Evaluates the policy on fixed games at step 0, every ``every`` steps and at the last step, and hands
    each point to ``on_point``. One process only: every process of a multi-process launch would evaluate."""

    def __init__(self, rows: list[dict[str, Any]], max_turns: int, every: int, on_point: Any):
        self.rows = rows
        self.max_turns = max_turns
        self.every = every
        self.on_point = on_point
        self.eval_args: EvalArguments | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, processing_class: Any = None,
                       **kwargs: Any) -> None:
        # Decoding as in training (layout, prompt window, response length, temperature, bf16 autocast), so the
        # curve measures the policy that is being trained; all episodes in one batch.
        self.eval_args = EvalArguments(
            layout=args.layout,
            history_window=args.history_window,
            max_turns=self.max_turns,
            max_prompt_tokens=args.max_prompt_tokens,
            max_completion_length=args.max_completion_length,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=EVAL_SEED,
            eval_batch_size=len(self.rows),
            bf16=args.bf16,
        )
        self._evaluate(0, args.environment, model, processing_class)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, processing_class: Any = None,
                    **kwargs: Any) -> None:
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._evaluate(state.global_step, args.environment, model, processing_class)

    def _evaluate(self, step: int, environment: str, model: Any, tokenizer: Any) -> None:
        began = time.perf_counter()
        # evaluate_rows reseeds torch; forking the RNG keeps training's own random stream untouched, so a run
        # samples the same rollouts whatever its evaluation schedule.
        devices = list(range(torch.cuda.device_count()))
        with torch.random.fork_rng(devices=devices):
            trajectories = evaluate_rows(self.rows, model, tokenizer, self.eval_args, get_env_factory(environment))
        turns = [turn for trajectory in trajectories for turn in trajectory.turns]
        summary = summarize(trajectories)
        self.on_point({
            "step": step,
            "success": summary["overall"]["success"],
            "valid_action_rate": sum(turn.action_valid for turn in turns) / len(turns) if turns else 0.0,
            "success_per_family": {family: stats["success"] for family, stats in summary["groups"].items()},
            "eval_seconds": round(time.perf_counter() - began, 1),
        })


def _write_json(path: Path, value: Any) -> None:
    """Write through a temporary file and a rename, so whoever polls the file never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(value, indent=2))
    os.replace(staging, path)


def _mean_curve(curves: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Mean of each plotted metric over seeds at the steps every seed has reached (a stopped run leaves shorter
    curves)."""
    by_step = [{point["step"]: point for point in curve} for curve in curves]
    shared = set.intersection(*(set(steps) for steps in by_step))
    return [
        {"step": step, **{metric: sum(s[step][metric] for s in by_step) / len(by_step) for metric in PANELS}}
        for step in sorted(shared)
    ]


def write_report(out: Path, header: dict[str, Any], methods: tuple[str, ...]) -> dict[str, Any]:
    """Merge the run files under ``out/runs`` into ``learning_curve.json`` and draw ``learning_curve.png``."""
    report: dict[str, Any] = {**header, "methods": {}}
    for method in methods:
        runs = [json.loads(path.read_text()) for path in sorted((out / "runs").glob(f"{method}_seed*.json"))]
        runs = [run for run in runs if run["points"]]
        if runs:
            report["methods"][method] = {
                "seeds": {str(run["seed"]): run["points"] for run in runs},
                "mean": _mean_curve([run["points"] for run in runs]),
            }
    report = json.loads(json.dumps(report))  # returned as a reader of the file sees it (tuples become lists)
    _write_json(out / "learning_curve.json", report)
    _plot(report, out / "learning_curve.png")
    return report


def _plot(report: dict[str, Any], path: Path) -> None:
    # The object API with an explicit Agg canvas: no pyplot state and no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(11.0, 4.0), dpi=100)
    FigureCanvasAgg(figure)
    for ax, (metric, title) in zip(figure.subplots(1, len(PANELS)), PANELS.items()):
        for k, (method, curves) in enumerate(report["methods"].items()):
            color = f"C{k}"
            for points in curves["seeds"].values():
                ax.plot([p["step"] for p in points], [p[metric] for p in points], color=color, alpha=0.35,
                        linewidth=1)
            mean = curves["mean"]
            seeds = len(curves["seeds"])
            ax.plot([p["step"] for p in mean], [p[metric] for p in mean], color=color, linewidth=2.5, marker="o",
                    label=f"{method} (mean of {seeds} seed{'s' * (seeds > 1)})")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(title)
        ax.set_ylim(-0.05, 1.05)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title}, {report['eval_games']} eval_unseen ALFWorld games")
        ax.grid(alpha=0.3)
        if report["methods"]:
            ax.legend(fontsize="small")
    figure.suptitle(f"learning curves, {report['setting']} setting")
    figure.tight_layout()
    figure.savefig(path, format="png")


def train_one(method: str, seed: int, setting: Setting, model: str, out: Path, header: dict[str, Any],
              eval_rows: list[dict[str, Any]]) -> None:
    """Train one method with one seed, recording its curve to ``out/runs`` after every evaluation."""
    run_file = out / "runs" / f"{method}_seed{seed}.json"
    run: dict[str, Any] = {"method": method, "seed": seed, "points": []}

    def record(point: dict[str, Any]) -> None:
        run["points"].append(point)
        print(f"[learning-curve] {method} seed {seed} step {point['step']}: success {point['success']:.2f} "
              f"valid {point['valid_action_rate']:.2f} ({point['eval_seconds']:.0f} s)", flush=True)
        _write_json(run_file, run)
        write_report(out, header, setting.methods)

    argv = [
        "--config", str(ROOT / "recipes" / "quickstart" / f"alfworld_{method}_cpu.yaml"),
        "--max_steps", str(setting.steps),
        "--seed", str(seed),
        "--output_dir", str(out / "train" / f"{method}_seed{seed}"),
        "--games_dir", str(out / "games" / "train"),  # the recipe's split and seed, generated once here
        *setting.overrides,
    ]
    recorder = CurveRecorder(eval_rows, setting.eval_turns, setting.eval_every, record)
    trainer = build_trainer(argv, callbacks=[recorder], model_override=model)
    try:
        trainer.train()
    finally:
        trainer.close()


def eval_game_rows(setting: Setting, out: Path) -> list[dict[str, Any]]:
    """The fixed ``eval_unseen`` games (generated once, seed 0) as dataset rows."""
    games_dir = out / "games" / "eval_unseen"
    families = list(setting.eval_families or TASK_TYPES)
    files = find_game_files(games_dir) if games_dir.exists() else []
    if not files:
        files = generate_games(games_dir, setting.eval_games_per_family, 0, "eval_unseen", task_types=families)
    return task_spec_rows(sorted(files))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report written to ``<out>/learning_curve.json``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=list(SETTINGS), default="cpu")
    parser.add_argument("--model", default=WARM_START, help="policy to start from (default: the warm start)")
    parser.add_argument("--out", help="output folder (default: outputs/learning_curve/<setting>)")
    parser.add_argument("--steps", type=int, help="override the setting's optimizer steps per run")
    parser.add_argument("--eval-every", type=int, help="override the setting's evaluation interval")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # "<method>:<seed>": one run, in a child process
    args = parser.parse_args(argv)

    setting = replace(
        SETTINGS[args.setting],
        **({"steps": args.steps} if args.steps else {}),
        **({"eval_every": args.eval_every} if args.eval_every else {}),
    )
    out = Path(args.out or f"outputs/learning_curve/{args.setting}").resolve()
    model = resolve_policy_path(args.model)
    eval_rows = eval_game_rows(setting, out)
    header = {
        "setting": args.setting,
        "model": args.model,
        "eval_games": len(eval_rows),
        "eval_seed": EVAL_SEED,
        "config": asdict(setting),
        "provenance": provenance(argv, __file__),
    }
    if args.only:
        method, seed = args.only.split(":")
        train_one(method, int(seed), setting, model, out, header, eval_rows)
        return write_report(out, header, setting.methods)

    for stale in (out / "runs").glob("*.json"):  # a previous invocation's runs must not enter this report
        stale.unlink()
    for seed in setting.seeds:
        for method in setting.methods:
            if setting.isolate:
                child = [sys.executable, __file__, "--setting", args.setting, "--model", args.model, "--out", str(out),
                         "--steps", str(setting.steps), "--eval-every", str(setting.eval_every),
                         "--only", f"{method}:{seed}"]
                subprocess.run(child, check=True)
            else:
                train_one(method, seed, setting, model, out, header, eval_rows)
    report = write_report(out, header, setting.methods)
    for method, curves in report["methods"].items():
        print(f"[learning-curve] {method} mean success by step: "
              + ", ".join(f"{p['step']}: {p['success']:.2f}" for p in curves["mean"]), flush=True)
    print(f"[learning-curve] wrote {out / 'learning_curve.json'} and {out / 'learning_curve.png'}", flush=True)
    return report


if __name__ == "__main__":
    main()
