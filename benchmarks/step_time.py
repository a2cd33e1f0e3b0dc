"""Training step time of TASPO (rule-based analyzer) and AlignOPSD over the GRPO baseline, in one run, on the
same games, seeds and model.

A 135M model almost never completes an ALFWorld task, and a group without a success leaves TASPO with
nothing to do (A.3 fallback), so a run with sampled responses would only time the fallback. The siblings here
therefore replay fixed plans (two follow the game's walkthrough and win, two stall), with every response token
scored by the real model as sampling would record it. TASPO then builds PI and runs its privileged pass on
every trajectory that has PI; AlignOPSD runs its privileged pass, the encoder and up to k aligned views per
turn. All trainers run the same steps on the same rows; the report is the ratio of the median step times and
the time of the extra passes.

    python benchmarks/step_time.py --steps 3                 # bf16 autocast where the CPU computes bf16
    python benchmarks/step_time.py --steps 3 --bf16 false    # float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from datasets import Dataset

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.models import EMBEDDED_MODEL
from taspo_trl.warmstart import resolve_policy_path
from taspo_trl.precision import choose_precision
from taspo_trl.provenance import provenance, source_commit
from taspo_trl.testing import PlannedGenerator
from taspo_trl.trainers import method_classes

METHODS = ("grpo", "taspo", "alignopsd")
"""The methods timed: GRPO and the two papers' methods."""


EXTRA_PASSES = {
    "TASPO rescoring": "taspo/rescoring_seconds",
    "analyzer": "pi/analyzer_seconds",
    "AlignOPSD teacher generation": "alignopsd/teacher_generation_seconds",
    "AlignOPSD encoder": "alignopsd/encoder_seconds",
    "AlignOPSD rescoring": "alignopsd/rescoring_seconds",
}
"""The logged seconds of each method's passes beyond GRPO's, by name."""


def _plans(walkthrough: list[str], max_turns: int) -> list[list[str | None]]:
    return [
        list(walkthrough),
        walkthrough[:1] + ["look"] + walkthrough[1:],
        (walkthrough[:2] + [None] + ["look"] * max_turns)[:max_turns],
        (["inventory"] * max_turns),
    ]


def _time_method(name: str, model: str, game: Path, steps: int, layout: str, out_dir: Path, bf16: bool) -> dict:
    max_turns = len(json.loads(game.read_text())["walkthrough"]) + 1
    common = dict(
        output_dir=str(out_dir / name),
        layout=layout,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=48,
        max_turns=max_turns,
        max_steps=steps,
        learning_rate=1e-6,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=bf16,
        seed=0,
    )
    config_class, trainer_class = method_classes(name)
    config = config_class(**common)
    dataset = Dataset.from_list(task_spec_rows([game]) * steps)
    trainer = trainer_class(model=model, args=config, train_dataset=dataset)
    walkthrough = json.loads(game.read_text())["walkthrough"]
    grpo_module.generator_for_trainer = lambda t, batch_size=None: PlannedGenerator(
        t.model, t.processing_class, _plans(walkthrough, max_turns)
    )
    trainer.train()
    trainer.close()
    logs = [entry for entry in trainer.state.log_history if "step_time" in entry]
    parts = {name: [entry.get(key, 0.0) for entry in logs] for name, key in EXTRA_PASSES.items()}
    return {
        "step_times": [entry["step_time"] for entry in logs],
        "extra": [sum(values) for values in zip(*parts.values())],
        "extra_parts": {name: values for name, values in parts.items() if any(values)},
        "pi_coverage": [entry.get("pi/coverage", 0.0) for entry in logs],
        "rows": [entry["rows/count"] for entry in logs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layout", default="turn", choices=["turn", "sequence"])
    parser.add_argument("--bf16", choices=("true", "false"), default=None,
                        help="bf16 autocast (default: where the CPU computes bf16)")
    parser.add_argument("--only", choices=list(METHODS), help=argparse.SUPPRESS)  # one method, in a child process
    parser.add_argument("--game", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="default: benchmarks/results/step_time_<bf16|float32>.json")
    args = parser.parse_args()

    model = resolve_policy_path(args.model)
    chosen = choose_precision(None if args.bf16 is None else args.bf16 == "true", use_cpu=True)
    bf16 = chosen.bf16
    if args.only:
        with tempfile.TemporaryDirectory() as tmp:
            result = _time_method(args.only, model, Path(args.game), args.steps, args.layout, Path(tmp), bf16)
        Path(args.out).write_text(json.dumps(result))
        return

    # Each method trains in a fresh process, so one method's memory never slows the next one down.
    commit = source_commit(__file__)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        game = generate_games(Path(tmp) / "games", 1, 0, "train", task_types=["pick_and_place_simple"])[0]
        for name in METHODS:
            out = Path(tmp) / f"{name}.json"
            subprocess.run(
                [sys.executable, __file__, "--only", name, "--game", str(game), "--out", str(out),
                 "--model", args.model, "--steps", str(args.steps), "--layout", args.layout,
                 "--bf16", "true" if bf16 else "false"],
                check=True,
            )
            results[name] = json.loads(out.read_text())

    precision = chosen.name
    print(f"model={args.model} layout={args.layout} steps={args.steps} {precision} rows/step={results['grpo']['rows']}")
    for name, result in results.items():
        print(f"{name:<10} step times (s): {', '.join(f'{t:.1f}' for t in result['step_times'])}; "
              f"extra passes (s): {', '.join(f'{t:.1f}' for t in result['extra'])}")
        for part, values in result["extra_parts"].items():
            print(f"{'':<10} {part} (s): {', '.join(f'{t:.1f}' for t in values)}")
    print(f"TASPO PI coverage per step: {results['taspo']['pi_coverage']}")
    grpo = statistics.median(results["grpo"]["step_times"])
    ratios = {name: statistics.median(results[name]["step_times"]) / grpo for name in ("taspo", "alignopsd")}
    for name, ratio in ratios.items():
        print(f"step time ratio {name} / grpo (medians): {ratio:.3f}")
    out = Path(args.out or Path(__file__).parent / "results" / f"step_time_{'bf16' if bf16 else 'float32'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"settings": {"model": args.model, "layout": args.layout, "steps": args.steps}, "precision": precision,
              "methods": results, "ratios_to_grpo": {name: round(r, 3) for name, r in ratios.items()},
              "provenance": provenance(sys.argv[1:], __file__, commit=commit)}
    out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
