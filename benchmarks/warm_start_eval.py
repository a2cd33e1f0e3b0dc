"""How well a policy acts on ALFWorld: the embedded model against its warm start (or any checkpoints).

    python benchmarks/warm_start_eval.py                       # embedded vs embedded:smollm2-135m-alfworld
    python benchmarks/warm_start_eval.py --models PATH [PATH ...] --games-per-type 2 --out results.json

Two measurements per model, both with the quickstart's prompts (turn layout; the history window the model was
trained with, read from its ``warm_start.json``, else 1, or ``--history-window``):
1. greedy decoding on generated ``eval_unseen`` games (rooms and objects the warm start never saw; 10 per family
   by default): the valid-action rate over all turns, success per task family and overall with its 95 % Wilson
   interval, and the mean steps of the won episodes;
2. sampling at temperature 1 on fresh train games (``--train-games-seed``, default the quickstarts' seed, whose
   games no warm start trained on; 4 per family) with K siblings per game, as an RL step samples them: in how many
   groups at least one sibling wins (what TASPO needs to have something to learn from) and how many are mixed.

Prints a markdown table per measurement and writes everything as JSON, with the run's provenance (the results page
renders it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from taspo_trl.envs import get_env_factory
from taspo_trl.envs.alfworld import TASK_SHORT_NAMES, generate_games, task_spec_rows
from taspo_trl.evaluation import EvalArguments, evaluate_rows, wilson_interval
from taspo_trl.models import load_model_and_tokenizer
from taspo_trl.provenance import provenance, source_commit
from taspo_trl.warmstart import FRESH_GAMES_SEED, resolve_policy_path, trained_history_window


def act_stats(trajectories: list[Any]) -> dict[str, Any]:
    """Valid-action rate, success per family and overall, mean steps of won episodes."""
    turns = [turn for t in trajectories for turn in t.turns]
    families: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        families[t.task_type or "unknown"].append(t.won)
    won = [t for t in trajectories if t.won]
    return {
        "valid_action_rate": sum(turn.action_valid for turn in turns) / max(len(turns), 1),
        "success": len(won) / max(len(trajectories), 1),
        "success_interval_95": wilson_interval(len(won), len(trajectories)),
        "wins": len(won),
        "success_per_family": {f: sum(w) / len(w) for f, w in sorted(families.items())},
        "wins_per_family": {f: sum(w) for f, w in sorted(families.items())},
        "families_with_a_win": sum(any(w) for w in families.values()),
        "mean_steps_won": sum(t.num_turns for t in won) / len(won) if won else None,
        "episodes": len(trajectories),
    }


def group_stats(trajectories: list[Any], group_size: int) -> dict[str, Any]:
    groups = [trajectories[i : i + group_size] for i in range(0, len(trajectories), group_size)]
    wins = [sum(t.won for t in g) for g in groups]
    return {
        "groups": len(groups),
        "groups_with_a_success": sum(w > 0 for w in wins),
        "mixed_groups": sum(0 < w < group_size for w in wins),
        "wins_per_group": wins,
        **act_stats(trajectories),
    }


def evaluate_model(
    model_name: str, label: str, unseen_rows: list[dict], train_rows: list[dict], args: argparse.Namespace
) -> dict[str, Any]:
    model_dir = resolve_policy_path(model_name, bf16=args.bf16)
    model, tokenizer = load_model_and_tokenizer(model_dir)
    window = args.history_window or trained_history_window(model_dir)
    env_factory = get_env_factory("alfworld")
    started = time.perf_counter()
    greedy = EvalArguments(history_window=window, max_turns=args.eval_turns, max_completion_length=args.max_completion_length,
                           temperature=0.0, eval_batch_size=len(unseen_rows), seed=args.seed, bf16=args.bf16)
    unseen = act_stats(evaluate_rows(unseen_rows, model, tokenizer, greedy, env_factory))
    sampled = EvalArguments(history_window=window, max_turns=args.train_turns, max_completion_length=args.max_completion_length,
                            temperature=1.0, eval_batch_size=len(train_rows) * args.siblings, seed=args.seed,
                            bf16=args.bf16)
    siblings = [row for row in train_rows for _ in range(args.siblings)]
    train = group_stats(evaluate_rows(siblings, model, tokenizer, sampled, env_factory), args.siblings)
    return {"model": label, "history_window": window, "bf16": greedy.bf16, "eval_unseen_greedy": unseen, "train_siblings_t1": train,
            "seconds": round(time.perf_counter() - started, 1)}


def render(results: list[dict[str, Any]]) -> str:
    """Markdown tables of the per-model results of one or more runs: greedy on unseen games, sampled on fresh ones."""
    families = sorted({f for r in results for f in r["eval_unseen_greedy"]["success_per_family"]})
    short = [TASK_SHORT_NAMES.get(f, f) for f in families]
    lines = [
        "Greedy, eval_unseen:",
        "",
        "| Model | Valid actions | " + " | ".join(short) + " | All [95 %] | Mean steps (won) |",
        "|---|---|" + "---|" * len(families) + "---|---|",
    ]
    for r in results:
        g = r["eval_unseen_greedy"]
        steps = "-" if g["mean_steps_won"] is None else f"{g['mean_steps_won']:.1f}"
        cells = " | ".join(f"{g['success_per_family'].get(f, 0.0):.2f}" for f in families)
        low, high = g["success_interval_95"]
        lines.append(f"| {r['model']} | {g['valid_action_rate']:.2f} | {cells} | {g['success']:.2f} "
                     f"[{low:.2f}, {high:.2f}] ({g['wins']}/{g['episodes']}) | {steps} |")
    lines += ["", "Temperature 1, fresh train games (never in the warm start's data), K siblings per game:", "",
              "| Model | Valid actions | Success | Groups with a success | Mixed groups |", "|---|---|---|---|---|"]
    for r in results:
        t = r["train_siblings_t1"]
        low, high = t["success_interval_95"]
        lines.append(f"| {r['model']} | {t['valid_action_rate']:.2f} | {t['success']:.2f} [{low:.2f}, {high:.2f}] | "
                     f"{t['groups_with_a_success']}/{t['groups']} | {t['mixed_groups']}/{t['groups']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["embedded", "embedded:smollm2-135m-alfworld"])
    parser.add_argument("--labels", nargs="+", default=None,
                        help="a name per model for the tables and the JSON (default: the model names)")
    parser.add_argument("--games-per-type", type=int, default=10, help="eval_unseen games per family")
    parser.add_argument("--train-games-per-type", type=int, default=4, help="fresh train games per family")
    parser.add_argument("--train-games-seed", type=int, default=FRESH_GAMES_SEED,
                        help="seed of the fresh train games (default: the quickstarts', never in a warm start's data)")
    parser.add_argument("--eval-turns", type=int, default=20)
    parser.add_argument("--train-turns", type=int, default=12, help="the quickstart's max_turns")
    parser.add_argument("--siblings", type=int, default=4, help="siblings per fresh game (the quickstart's num_generations)")
    parser.add_argument("--max-completion-length", type=int, default=48, help="the quickstart's response length")
    parser.add_argument("--history-window", type=int, default=None,
                        help="prompt history window (default: the model's warm_start.json, else 1)")
    parser.add_argument("--seed", type=int, default=0, help="evaluation seed (greedy decoding ignores it: only the temperature-1 episodes change with it)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="sample under bf16 autocast (--no-bf16: float32; default: bf16 where the hardware "
                             "computes it, as the CPU quickstarts sample)")
    parser.add_argument("--games-dir", default=None, help="where to generate the games (default: a temp folder)")
    parser.add_argument("--out", default="outputs/warm_start_eval.json")
    args = parser.parse_args(argv)
    labels = args.labels or args.models
    if len(labels) != len(args.models):
        parser.error(f"--labels names {len(labels)} models but --models lists {len(args.models)}; give one label each")
    commit = source_commit(__file__)  # the code that plays the games, whatever HEAD is at the end

    root = Path(args.games_dir or tempfile.mkdtemp(prefix="warm_start_eval-"))
    unseen_rows = task_spec_rows(generate_games(root / "eval_unseen", args.games_per_type, 0, "eval_unseen"))
    train_rows = task_spec_rows(generate_games(root / "train", args.train_games_per_type, args.train_games_seed, "train"))
    models = [evaluate_model(name, label, unseen_rows, train_rows, args) for name, label in zip(args.models, labels)]
    settings = {key: getattr(args, key) for key in (
        "games_per_type", "train_games_per_type", "train_games_seed", "eval_turns", "train_turns", "siblings",
        "max_completion_length", "seed")}
    result = {"settings": settings, "models": models, "provenance": provenance(argv, __file__, commit=commit)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(render(models), flush=True)
    print(f"wrote {args.out}", flush=True)
    return result


if __name__ == "__main__":
    main()
