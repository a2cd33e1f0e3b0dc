"""Write the documentation's results page from the JSON files the benchmarks wrote under benchmarks/results/.

    python benchmarks/results_page.py            # rewrite docs/results.md
    python benchmarks/results_page.py --check    # exit 1 when docs/results.md no longer matches the JSON

No figure on the page is typed by hand: each table is rendered from one result file, with that file's provenance
(date, commit, CPU model and flags, command). tests/test_results_page.py fails when the committed page and the
JSON disagree, so a rerun that changes a figure also changes the page.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"

HEADER = """# Results

Every figure here is generated from the JSON file named under its heading, by `python benchmarks/results_page.py`;
the test suite fails when this page and those files disagree. Each section says when, on which commit, on which
CPU and with which command its result was measured. Earlier measurements and the settings tried along the way are
in the [experiment log](experiment-log.md).
"""


def _provenance(result: dict[str, Any], file_name: str) -> str:
    meta = result.get("provenance")
    if not meta:
        raise ValueError(f"benchmarks/results/{file_name} has no 'provenance' block: rerun its benchmark")
    flags = ", ".join(meta["cpu_flags"]) or "none of avx2, avx512f, avx512_bf16, amx_bf16"
    lines = [
        f"- Data: `benchmarks/results/{file_name}`",
        f"- Measured: {meta['date']}, commit `{(meta['commit'] or 'unknown')[:12]}`",
        f"- CPU: {meta['cpu_model']} (flags: {flags})",
        f"- Command: `{meta['command']}`",
    ]
    if meta.get("recorded"):
        lines.append(f"- Provenance recorded {meta['recorded']}")
    return "\n".join(lines)


def _auc(value: float) -> str:
    return f"{value:.3f}"


def _with_interval(value: float, interval: dict[str, float | None], signed: bool = False) -> str:
    number = f"{value:+.3f}" if signed else f"{value:.3f}"
    if interval["low"] is None:
        return number
    return f"{number} [{interval['low']:+.3f}, {interval['high']:+.3f}]" if signed else \
        f"{number} [{interval['low']:.3f}, {interval['high']:.3f}]"


def credit_quality(result: dict[str, Any]) -> str:
    """Per method, the AUC of the action weights against the planner's progress labels."""
    summary = result["batch"]
    settings = result["settings"]
    precision = "bf16 autocast" if settings.get("bf16") else "float32"
    lines = [
        f"{settings['batches']} batches of {settings['siblings']} siblings ({summary['trajectories']} trajectories, "
        f"{summary['won']} won, {summary['nonzero_advantage']} with a non-zero advantage), {settings['group_size']} "
        f"per game, up to {settings['max_turns']} turns, {precision}, policy `{settings['model']}`. In won "
        "trajectories an AUC above 0.5 means progress actions get more of the reward; in failed ones an AUC below "
        "0.5 means they get less of the blame. GRPO is 0.5 by construction.",
        "",
        "| method | AUC won [95 %] | moved | AUC failed [95 %] | moved | won: minus GRPO | failed: minus GRPO |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, entry in result["methods"].items():
        cells = []
        for pool in ("success", "failed"):
            cells += [_with_interval(entry["scores"][pool]["auc"], entry["intervals"][pool]["auc"]),
                      f"{entry['moved'][pool]:.2f}"]
        for pool in ("success", "failed"):
            diff = entry["intervals"][pool].get("minus_grpo")
            cells.append("-" if diff is None else _with_interval(diff["estimate"], diff, signed=True))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    bootstrap, counts = result["bootstrap"], next(iter(result["methods"].values()))["scores"]
    added = f"; {bootstrap['added']}" if bootstrap.get("added") else ""
    lines += ["", f"Intervals: 95 % percentile bootstrap over whole task groups ({bootstrap['resamples']} resamples"
              f"{added}). *moved*: the share of trajectories whose weights are not all 1. Actions counted (progress "
              f"/ other): won {counts['success']['progress_actions']} / {counts['success']['other_actions']}, failed "
              f"{counts['failed']['progress_actions']} / {counts['failed']['other_actions']}."]
    lines += ["", "Per batch (sampling seed), AUC won / failed:", "",
              "| method | " + " | ".join(f"seed {b['seed']}" for b in result["per_batch"]) + " |",
              "|---|" + "---|" * len(result["per_batch"])]
    for method in result["methods"]:
        cells = [f"{_auc(b['methods'][method]['success']['auc'])} / {_auc(b['methods'][method]['failed']['auc'])}"
                 for b in result["per_batch"]]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def learning_curve(result: dict[str, Any]) -> str:
    """Evaluation success (of ``eval_games``) against the training step, per method and seed."""
    games = result["eval_games"]
    lines = ["![success and valid-action rate against step](results/learning_curve_cpu.png)", "",
             f"Success on {games} `eval_unseen` games (sampled, evaluation seed {result['eval_seed']}), "
             f"starting from `{result['model']}`; {result['config']['steps']} steps per run.", ""]
    runs = [(f"{method}, seed {seed}", points) for method, entry in result["methods"].items()
            for seed, points in entry["seeds"].items()]
    steps = [point["step"] for point in runs[0][1]]
    lines += ["| run | " + " | ".join(f"step {step}" for step in steps) + " |", "|---|" + "---|" * len(steps)]
    for name, points in runs:
        lines.append(f"| {name} | " + " | ".join(f"{round(p['success'] * games)} of {games}" for p in points) + " |")
    return "\n".join(lines)


def pi_specificity(result: dict[str, Any]) -> str:
    """Log-prob shifts under each trajectory's own privileged information against another task's."""
    settings = result["settings"]
    own, foreign = result["mean_shift_own_pi"], result["mean_shift_foreign_pi"]
    return "\n".join([
        f"{result['actions']} actions of {settings['siblings']} siblings on the `{settings['split']}` games "
        f"({result['quoted_actions']} of them quoted by their own guidance), policy `{settings['model']}`, "
        f"history window {settings['history_window']}.",
        "",
        "| figure | own guidance | another task's guidance |",
        "|---|---|---|",
        f"| mean \\|shift\\| | {result['mean_abs_shift_own_pi']:.3f} | {result['mean_abs_shift_foreign_pi']:.3f} |",
        f"| mean shift, quoted actions | {own['quoted']:+.3f} | {foreign['quoted']:+.3f} |",
        f"| mean shift, other actions | {own['not_quoted']:+.3f} | {foreign['not_quoted']:+.3f} |",
        "",
        f"Correlation of the two shifts over the actions: {result['correlation']:.2f}.",
    ])


SECTIONS: list[tuple[str, str, Callable[[dict[str, Any]], str]]] = [
    ("Credit quality: does the credit go to the actions that mattered?", "credit_quality_sampled_bf16.json",
     credit_quality),
    ("Learning curve (CPU setting)", "learning_curve_cpu.json", learning_curve),
    ("Does the policy read its privileged context?", "pi_specificity.json", pi_specificity),
]


def render(results_dir: Path = RESULTS) -> str:
    """The whole results page, from the JSON files in ``results_dir``."""
    parts = [HEADER]
    for title, file_name, section in SECTIONS:
        result = json.loads((results_dir / file_name).read_text())
        parts.append(f"## {title}\n\n{section(result)}\n\n{_provenance(result, file_name)}\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/results.md is up to date")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            print("docs/results.md does not match benchmarks/results/: run python benchmarks/results_page.py",
                  file=sys.stderr)
            return 1
        print("docs/results.md matches benchmarks/results/")
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
