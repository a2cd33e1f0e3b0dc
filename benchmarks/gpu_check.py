"""A prepared GPU check: GRPO, TASPO and AlignOPSD train a few steps plain, then under DeepSpeed ZeRO-2 and ZeRO-3
on one process, on a random-init model with Qwen2.5-0.5B's shape in bf16. Nothing is downloaded at run time.

The policy is random, so the rollouts replay scripted plans (two siblings of each group win, two stall) in a
small pure-Python room with ALFWorld's command grammar, with every response token scored by the model as
sampling would record it (`PlannedGenerator`). The rule-based analyzer therefore finds successes to build
TASPO's PI from, and AlignOPSD finds sibling turns to align, on every step.

Reported, per mode and method: step times (the check's own log-prob probe subtracted), the TASPO/GRPO and
AlignOPSD/GRPO ratios of the median step times, max |recomputed - sampling log-prob| over the policy tokens,
and peak GPU memory; then whether PI and credit weights of each DeepSpeed run equal the plain run's. All of it
goes to one JSON file ($OUT/gpu_check.json, or --out) and a short table on stdout.

The tokenizer is SmolLM2's (the embedded policy's): Qwen's own cannot be had offline. The model keeps Qwen2.5's
vocabulary size (151,936), so the LM head and the log-prob passes cost what they cost on the real model; the
tokenizer only ever produces ids below its 49,152.

    bash benchmarks/gpu_wheels.sh                 # here: wheels and offline assets (docs/distributed.md, "GPU check")
    bash benchmarks/gpu_check.sh                  # on the GPU machine
    python benchmarks/gpu_check.py --dry-run      # CPU, tiny model, float32, no DeepSpeed (the tests run this)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("grpo", "taspo", "alignopsd")
DEEPSPEED_MODES = ("zero2", "zero3")
MAX_TURNS = 4  # the walkthrough's 3 steps plus walkthrough_plans' detour
QWEN25_05B = dict(  # Qwen2.5-0.5B's config.json, by hand (no download)
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    intermediate_size=4864,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
)
TINY = dict(model_type="qwen2")  # make_tiny_model_dir's tiny sizes, same architecture, the tokenizer's vocabulary
# Credit weights lie in [0.6, 1.4] (TASPO eps_w 0.4) and are built from log-prob shifts of a random model, which
# are mostly rounding noise: bf16 spaces log-probs near -12 by 1/16 nat, so two bf16 numerics (autocast over
# float32 weights in the plain run, bf16 weights under DeepSpeed) may move a weight by a few hundredths. A
# wiring error (another row, another turn, a missing PI) moves it across the whole range.
WEIGHT_TOLERANCE = {"bf16": 0.1, "float32": 1e-6}
# One mode's process on the GPU: three trainers of three steps each take well under this; a hang (a collective
# that never returns) must leave time for the other modes inside the 8-minute budget.
MODE_TIMEOUT = 150
VERSIONED = ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "deepspeed", "sentence-transformers")


# ----------------------------------------------------------------------------------------- the environment


class CdDrawerEnv:
    """One room in ALFWorld's command grammar, with no text engine: take the cd from the desk, put it in the
    open drawer. Commands outside the admissible list answer "Nothing happens.", as ALFWorld does. Three steps
    are enough for the rule-based analyzer's requirements, preconditions and orderings, and keep the rows few."""

    action_tag = "action"
    env_name = "cd_drawer"
    task_type = "pick_and_place_simple"
    task = "put some cd in drawer."
    walkthrough = ["take cd 1 from desk 1", "go to drawer 1", "move cd 1 to drawer 1"]

    def __init__(self, max_turns: int = MAX_TURNS) -> None:
        self.max_turns = max_turns
        self.location, self.holding = "desk 1", False

    def reset(self) -> str:
        self.location, self.holding = "desk 1", False
        return f"You are at the desk 1 of a room with a drawer 1 and a shelf 1. {self._contents()}"

    @property
    def admissible_commands(self) -> list[str]:
        commands = ["look", "inventory"] + [f"go to {place}" for place in ("desk 1", "drawer 1", "shelf 1") if place != self.location]
        if self.location == "desk 1" and not self.holding:
            commands.append("take cd 1 from desk 1")
        if self.location == "drawer 1" and self.holding:
            commands.append("move cd 1 to drawer 1")
        return commands

    def step(self, action: str) -> Any:
        from taspo_trl.envs.base import StepResult

        if action not in self.admissible_commands:
            return StepResult("Nothing happens.", 0.0, False, self._info(False))
        if action == "move cd 1 to drawer 1":
            return StepResult("You move the cd 1 to the drawer 1.", 1.0, True, self._info(True))
        return StepResult(self._apply(action), 0.0, False, self._info(False))

    def _apply(self, action: str) -> str:
        if action.startswith("go to "):
            self.location = action[len("go to "):]
            return f"You arrive at {self.location}. {self._contents()}"
        if action.startswith("take "):
            self.holding = True
            return "You pick up the cd 1 from the desk 1."
        if action == "inventory":
            return "You are carrying: a cd 1." if self.holding else "You are not carrying anything."
        return f"You are at {self.location}. {self._contents()}"

    def _contents(self) -> str:
        if self.location == "desk 1":
            return "On the desk 1, you see a pen 1." if self.holding else "On the desk 1, you see a cd 1, and a pen 1."
        if self.location == "drawer 1":
            return "The drawer 1 is open. In it, you see nothing."
        if self.location == "shelf 1":
            return "On the shelf 1, you see a book 1."
        return ""

    def _info(self, won: bool) -> dict[str, Any]:
        return {"won": won, "admissible_commands": [] if won else self.admissible_commands}

    def close(self) -> None:
        pass


def cd_drawer_factory(spec: dict[str, Any]) -> CdDrawerEnv:
    return CdDrawerEnv(int(spec.get("max_turns", MAX_TURNS)))


# ----------------------------------------------------------------------------------------- one mode's runs


def _recording(trainer_class: type) -> type:
    """``trainer_class`` that records, after each rollout, what the check compares: the policy tokens' log-probs
    recomputed by the trainer's own pass against the sampling ones, and the method's PI and weights."""

    class Recording(trainer_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.check_records: list[dict[str, Any]] = []

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            import torch

            batch = super()._generate_and_score_completions(inputs)
            started = time.perf_counter()
            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            with torch.no_grad():
                recomputed = self._snapshot_logprobs(input_ids, attention_mask, batch["completion_ids"].size(1))
            policy = batch["tool_mask"] > 0  # response tokens of real rows (observations and padding rows are 0)
            gap = (recomputed.float() - batch["sampling_per_token_logps"]).abs()[policy]
            self.check_records.append(
                {
                    "logprob_max_abs_diff": gap.max().item(),  # .item() waits for the GPU, before the clock stops
                    "pi": list(self.last_step.privileged_info or self.last_step.skill_texts),
                    "weights": [list(w) for w in self.last_step.weights],
                    "probe_seconds": time.perf_counter() - started,
                }
            )
            return batch

    return Recording


def _run_method(method: str, mode: str, model_dir: str, encoder_dir: str | None, steps: int, dry_run: bool, out_dir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset

    import taspo_trl.trainers.grpo as grpo_module
    from taspo_trl.envs.base import encode_task_prompt
    from taspo_trl.testing import PlannedGenerator, walkthrough_plans
    from taspo_trl.trainers import method_classes

    config_class, trainer_class = method_classes(method)
    extra = {"encoder_path": encoder_dir} if method == "alignopsd" else {}
    # Task groups per step (each the 4 siblings of walkthrough_plans) and prompt history: TRL's fused LM head
    # scores every prompt token against the whole vocabulary, which on a CPU is most of a step.
    groups, history_window = (1, 1) if dry_run else (4, 3)
    config = config_class(
        output_dir=str(out_dir / f"{mode}-{method}"),
        layout="turn",
        num_generations=4,
        per_device_train_batch_size=4 * groups,
        max_completion_length=48,
        max_turns=MAX_TURNS,
        history_window=history_window,
        max_steps=steps,
        learning_rate=1e-6,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=dry_run,
        bf16=not dry_run,
        gradient_checkpointing=False,
        seed=0,
        **extra,
    )
    spec = {"env": CdDrawerEnv.env_name, "task": CdDrawerEnv.task, "task_type": CdDrawerEnv.task_type}
    dataset = Dataset.from_list([{"prompt": encode_task_prompt(spec)}] * groups)
    trainer = _recording(trainer_class)(model=model_dir, args=config, train_dataset=dataset, env_factory=cd_drawer_factory)
    plans = walkthrough_plans(CdDrawerEnv.walkthrough, MAX_TURNS) * groups
    # A fresh generator per rollout: it counts turns from zero.
    grpo_module.generator_for_trainer = lambda t, batch_size=None: PlannedGenerator(t.model, t.processing_class, plans)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        trainer.train()
    finally:
        trainer.close()
    logs = [entry for entry in trainer.state.log_history if "step_time" in entry]
    records = trainer.check_records
    result = {
        "step_times": [entry["step_time"] - record["probe_seconds"] for entry, record in zip(logs, records, strict=True)],
        "logprob_max_abs_diff": max(record["logprob_max_abs_diff"] for record in records),
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "pi_coverage": [entry.get("pi/coverage") for entry in logs],
        "pi": [record["pi"] for record in records],
        "weights": [record["weights"] for record in records],
        "loss": [entry.get("loss") for entry in logs],
    }
    del trainer
    return result


def run_mode(mode: str, model_dir: str, encoder_dir: str | None, steps: int, dry_run: bool) -> dict[str, Any]:
    """Train every method ``steps`` steps in this process (launched plain, or by accelerate under DeepSpeed)."""
    import gc

    import torch

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in METHODS:
            results[method] = _run_method(method, mode, model_dir, encoder_dir, steps, dry_run, Path(tmp))
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return results


# ----------------------------------------------------------------------------------------- assets


def export_assets(folder: Path) -> None:
    """Write the offline tokenizer and sentence-encoder description a GPU machine needs into ``folder`` (run here,
    once).

    The tokenizer comes from the embedded policy, whose 93 MB package cannot travel. The encoder travels without
    its weights: all-MiniLM-L6-v2's 44 MB even at half precision no longer fit in the 64 MiB a run carries next
    to the checkout and its shipped warm-start adapter. :func:`random_encoder` builds a seeded random-init model of
    the same architecture there. The check measures AlignOPSD's wiring, cost and ZeRO equality, not its matching
    quality, and its scripted siblings repeat the same thinking, which any encoder matches (cosine 1).
    """
    from transformers import AutoTokenizer

    from taspo_trl.warmstart import resolve_policy_path
    from taspo_trl.privileged.encoder import default_model_path

    AutoTokenizer.from_pretrained(resolve_policy_path("embedded")).save_pretrained(folder / "tokenizer")
    # The weights, model card, git attributes and training-data list are not needed to describe the model.
    shutil.copytree(default_model_path(), folder / "encoder", ignore=shutil.ignore_patterns(
        "*.safetensors", "*.bin", "onnx", "openvino", "README.md", ".gitattributes", "data_config.json"))


def random_encoder(source: Path, target: Path, seed: int = 0) -> str:
    """Copy the weightless encoder folder ``source`` to ``target`` with seeded random-init float32 weights of its
    architecture (the same weights for every ``seed``-equal call, so every mode of the check sees one encoder);
    returns ``target``."""
    import torch
    from transformers import AutoConfig, AutoModel

    shutil.copytree(source, target)
    torch.manual_seed(seed)
    AutoModel.from_config(AutoConfig.from_pretrained(source)).save_pretrained(target)
    return str(target)


# ----------------------------------------------------------------------------------------- the report


def _median_ratio(mode: dict[str, Any], method: str) -> float:
    return statistics.median(mode[method]["step_times"]) / statistics.median(mode["grpo"]["step_times"])


def compare_runs(reference: dict[str, Any], other: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """PI must be identical at every step, and the credit weights of the first step equal within ``tolerance``, for
    TASPO and AlignOPSD. Only the first step scores one policy in every mode. In bf16 the plain run's weights can
    drift from step to step while the ZeRO runs' stay nearly constant, as when bf16 weights round away updates of
    the check's learning rate that float32 weights keep: later steps compare different policies, so their largest
    difference is reported, not judged."""
    comparison: dict[str, Any] = {"tolerance": tolerance}
    for method in ("taspo", "alignopsd"):
        a, b = reference[method], other[method]
        diffs = [
            [abs(x - y) for traj_a, traj_b in zip(step_a, step_b, strict=True) for x, y in zip(traj_a, traj_b, strict=True)]
            for step_a, step_b in zip(a["weights"], b["weights"], strict=True)
        ]
        first = max(diffs[0], default=0.0) if diffs else 0.0
        comparison[method] = {
            "pi_equal": a["pi"] == b["pi"],
            "max_weight_diff": first,
            "max_weight_diff_later_steps": max((d for step in diffs[1:] for d in step), default=None),
            "weights_match": first <= tolerance,
        }
    return comparison


def summarize(modes: dict[str, Any], reference: str, precision: str) -> dict[str, Any]:
    """Ratios per finished mode, and each other finished mode compared with ``reference``."""
    finished = {name: mode for name, mode in modes.items() if "error" not in mode and "skipped" not in mode}
    ratios = {
        name: {f"{method}/grpo": _median_ratio(mode, method) for method in ("taspo", "alignopsd")}
        for name, mode in finished.items()
    }
    comparisons = {
        f"{reference} vs {name}": compare_runs(finished[reference], mode, WEIGHT_TOLERANCE[precision])
        for name, mode in finished.items()
        if name != reference and reference in finished
    }
    return {"ratios": ratios, "comparisons": comparisons}


def print_table(report: dict[str, Any]) -> None:
    print(f"\nGPU check on {report['device']} ({report['precision']}, {report['steps']} steps, "
          f"{report['model']['parameters'] / 1e6:.0f}M parameters), {report['wall_seconds']:.0f} s in all")
    print(f"{'mode':<7} {'method':<10} {'median step s':>13} {'x GRPO':>7} {'max|dlogp|':>10} {'peak GiB':>9}")
    for name, mode in report["modes"].items():
        if "error" in mode or "skipped" in mode:
            print(f"{name:<7} {mode.get('skipped') or 'error: ' + mode['error'].strip().splitlines()[-1]}")
            continue
        for method, result in mode.items():
            ratio = report["ratios"][name].get(f"{method}/grpo", 1.0)
            peak = "-" if result["peak_gpu_gib"] is None else f"{result['peak_gpu_gib']:.2f}"
            print(f"{name:<7} {method:<10} {statistics.median(result['step_times']):>13.2f} {ratio:>7.2f} "
                  f"{result['logprob_max_abs_diff']:>10.4f} {peak:>9}")
    for pair, comparison in report["comparisons"].items():
        for method in ("taspo", "alignopsd"):
            c = comparison[method]
            later = c.get("max_weight_diff_later_steps")
            print(f"{pair}, {method}: PI {'equal' if c['pi_equal'] else 'DIFFERENT'}, first step's max |weight diff| "
                  f"{c['max_weight_diff']:.2e} ({'within' if c['weights_match'] else 'OVER'} {comparison['tolerance']:g})"
                  + ("" if later is None else f"; later steps {later:.2e} (different policies, not judged)"))


# ----------------------------------------------------------------------------------------- the driver


def _launch(mode: str, model_dir: str, encoder_dir: str | None, steps: int, dry_run: bool, result: Path) -> list[str]:
    own = [str(Path(__file__).resolve()), "--mode", mode, "--model-dir", model_dir, "--steps", str(steps), "--result", str(result)]
    own += ["--encoder-dir", encoder_dir] if encoder_dir else []
    own += ["--dry-run"] if dry_run else []
    if mode not in DEEPSPEED_MODES:
        return [sys.executable, *own]
    # The project's own launch configs, as users run them, on one process.
    config = ROOT / "taspo_trl" / "recipes" / "accelerate" / f"{mode}.yaml"
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "1", *own]


def _run_child(command: list[str], env: dict[str, str], result: Path, timeout: float | None) -> dict[str, Any]:
    """One mode's results, or ``{"error": ...}``: one broken or hung mode must not cost the other modes' figures,
    since a GPU is lent rarely."""
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        tail = expired.stderr.decode(errors="replace")[-6000:] if isinstance(expired.stderr, bytes) else str(expired.stderr or "")
        return {"error": f"{tail}\ntimed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-6000:] + f"\nexit status {done.returncode}"}
    return json.loads(result.read_text())


def _parameter_count(model_dir: Path) -> int:
    """Parameters saved in ``model_dir``, read from the safetensors headers (tied weights count once)."""
    from safetensors import safe_open

    total = 0
    for shard in model_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
    return total


def run_check(out: Path, dry_run: bool, steps: int, assets: Path, deepspeed_modes: tuple[str, ...] = DEEPSPEED_MODES) -> dict[str, Any]:
    """Build the model, run the plain mode and each of ``deepspeed_modes`` in its own process, write the JSON report
    to ``out`` and return it."""
    import torch

    from taspo_trl.warmstart import resolve_policy_path
    from taspo_trl.provenance import package_versions, provenance
    from taspo_trl.testing import make_tiny_model_dir

    started = time.perf_counter()
    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here; use --dry-run for the CPU version")
    # Each mode runs in a fresh process: DeepSpeed and accelerate keep process-wide state, and peak memory is
    # then the mode's own. PYTHONPATH puts this checkout first, ahead of any installed copy of the package.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    modes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if dry_run:
            tokenizer, encoder_dir, shape = resolve_policy_path("embedded"), None, TINY
            # No DeepSpeed on a CPU: a second plain process stands in for it, so the comparison runs too.
            plan = [("plain", "plain"), ("repeat", "plain")]
        else:
            tokenizer, shape = str(assets / "tokenizer"), QWEN25_05B
            encoder_dir = random_encoder(assets / "encoder", work / "encoder")
            plan = [("plain", "plain"), *((mode, mode) for mode in deepspeed_modes)]
        model_dir = make_tiny_model_dir(work / "model", tokenizer_source=tokenizer, **shape)
        precision = "float32" if dry_run else "bf16"
        report: dict[str, Any] = {
            "device": "cpu (dry run)" if dry_run else torch.cuda.get_device_name(0),
            "precision": precision,
            "steps": steps,
            "model": {**shape, "parameters": _parameter_count(Path(model_dir))},
            "versions": package_versions(VERSIONED),
            "modes": modes,
            "provenance": provenance(None, __file__),
        }
        for name, mode in plan:
            if mode in DEEPSPEED_MODES and importlib.util.find_spec("deepspeed") is None:
                modes[name] = {"skipped": "deepspeed is not importable (bash benchmarks/gpu_wheels.sh carries it)"}
            else:
                print(f"gpu_check: {name} ...", flush=True)
                modes[name] = _run_child(_launch(mode, model_dir, encoder_dir, steps, dry_run, work / f"{name}.json"),
                                         env, work / f"{name}.json", None if dry_run else MODE_TIMEOUT)
            if "error" in modes[name] or "skipped" in modes[name]:
                print(f"gpu_check: {name}: {modes[name].get('skipped') or modes[name]['error']}", file=sys.stderr, flush=True)
            # Written after every mode, so a run cut short by its time limit still leaves the modes it finished.
            report.update(summarize(modes, "plain", precision), wall_seconds=time.perf_counter() - started)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1))
    print_table(report)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, float32, no DeepSpeed")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--deepspeed-modes", nargs="*", default=list(DEEPSPEED_MODES), choices=DEEPSPEED_MODES,
                        help="the DeepSpeed modes compared with the plain run (default: all)")
    default_out = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json")
    parser.add_argument("--out", type=Path, default=default_out, help="the JSON report (default: $OUT/gpu_check.json)")
    parser.add_argument("--assets", type=Path, default=ROOT / ".gpu_assets", help="tokenizer/ and encoder/ (gpu_wheels.sh)")
    parser.add_argument("--export-assets", type=Path, help="write the offline assets into this folder and exit")
    # One mode in this process (the driver launches these).
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--encoder-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.export_assets:
        export_assets(args.export_assets)
    elif args.mode:
        args.result.write_text(json.dumps(run_mode(args.mode, args.model_dir, args.encoder_dir, args.steps, args.dry_run)))
    else:
        run_check(args.out, args.dry_run, args.steps, args.assets, tuple(args.deepspeed_modes))


if __name__ == "__main__":
    main()
