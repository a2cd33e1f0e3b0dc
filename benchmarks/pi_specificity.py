"""Does the policy read TASPO's privileged context? Each action's privileged shift (Eq. 3, mean over the action's
tokens) under its own trajectory's PI, against the shift under the PI of another task.

If the policy reads the guidance, the two disagree: its own PI names this task's objects and steps, another task's
does not. If the shifts under a foreign PI track those under the trajectory's own (high correlation, similar
size), the context moves the policy's predictions whatever it says, and TASPO's weights redistribute that
generic movement rather than the guidance. A policy that reads it also raises the actions its PI quotes (the
rule-based analyzer's statements quote the commands, e.g. ``("take cd 1 from drawer 4")``) more than the others:
the JSON splits the mean shifts by whether the own PI quotes the action.

How much a shift can be: an action's shift is its mean token log-prob with the PI minus without it, and a log-prob
is at most 0, so the shift is at most the action's *gap* -``plain_logprob`` (its mean over tokens of -log pi without
the PI, the plain log-probs the trainer subtracts): an action the policy already predicts with certainty has nothing
to gain from any context. ``gap_share_own_quoted`` is the quoted actions' summed shift under their own PI over their
summed gap (1: the PI makes them certain; 0: no movement), ``gap_share_foreign_quoted`` the same under the foreign PI.

The batch is scripted (``credit_quality.py --siblings scripted``: per game two walkthrough wins and two stalling
failures, scored with the policy's real log-probs), so successes exist for any policy. The foreign PI of a
trajectory is the one of the trajectory ``--group-size`` places later (the same sibling of the next game).

    python benchmarks/pi_specificity.py                  # the warm-started policy, float32
    python benchmarks/pi_specificity.py --model <dir> --bf16
    python benchmarks/pi_specificity.py --split eval_unseen  # rooms and objects the warm start never saw
    python benchmarks/pi_specificity.py --resummarize outputs/pi_specificity/pi_specificity.json  # figures again

The correlation comes with a 95 % interval from a bootstrap over whole trajectories (a trajectory's actions share
one context, so they are not independent draws), and separately within the won and within the failed trajectories:
the stalling failures repeat a few commands (``look``), which any context may move alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset

from taspo_trl import TASPOTrainer
from taspo_trl.envs.alfworld import generate_games
from taspo_trl.provenance import provenance
from taspo_trl.trainers.step import StepView
from taspo_trl.warmstart import resolve_policy_path, trained_history_window

DEFAULT_TASK_TYPES = ("look_at_obj_in_light", "pick_and_place_simple", "pick_cool_then_place_in_recep")


def _credit_quality() -> Any:
    """The batch helpers of ``credit_quality.py`` (a script beside this one, not a package)."""
    spec = importlib.util.spec_from_file_location("credit_quality", Path(__file__).with_name("credit_quality.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def foreign_contexts(contexts: Sequence[str], group_size: int) -> list[str]:
    """Each non-empty context replaced by the one ``group_size`` places later (cyclically): the same sibling of the
    next task group. Empty contexts stay empty, so the same trajectories are rescored."""
    n = len(contexts)
    return [contexts[(i + group_size) % n] if contexts[i] else "" for i in range(n)]


def _action_shifts(
    trainer: TASPOTrainer, step: StepView, contexts: list[str]
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """Each scored action's mean privileged shift under ``contexts``, and its mean plain token log-prob: the plain
    log-probs that ``_privileged_shifts`` subtracts, over the same action span."""
    shifts, plain = trainer._privileged_shifts(step, contexts)
    plain_by_turn = step.rows.collect(plain)
    plain_means = {}
    for i, t in shifts:
        start, end = step.trajectories[i].turns[t].action_span
        plain_means[(i, t)] = float(plain_by_turn[(i, t)][start:end].double().mean())
    return {key: float(values.mean()) for key, values in shifts.items()}, plain_means


def quoted(action: str, context: str) -> bool:
    """Whether ``context`` quotes ``action`` as a command (the rule-based analyzer writes ``("go to drawer 4")``)."""
    return bool(action) and f'"{action}"' in context


def gap_share(shifts: Sequence[float], plain_logprobs: Sequence[float]) -> float | None:
    """Summed shift over summed gap (-plain log-prob) of some actions; ``None`` without actions or gap."""
    gap = -sum(plain_logprobs)
    return sum(shifts) / gap if plain_logprobs and gap > 0 else None


def _correlation(own: np.ndarray, foreign: np.ndarray) -> float | None:
    if len(own) < 2 or own.std() == 0 or foreign.std() == 0:
        return None
    return float(np.corrcoef(own, foreign)[0, 1])


def correlation_figures(shifts: Sequence[dict[str, Any]], resamples: int = 4000, seed: int = 0) -> dict[str, Any]:
    """The Pearson correlation of the own and foreign shifts over the actions of ``shifts`` (records with
    ``trajectory``, ``won``, ``own_pi`` and ``foreign_pi``); its 95 % percentile interval from ``resamples``
    bootstrap replicates that draw whole trajectories with replacement (replicates with a constant side are left
    out); and the correlation within the won and within the failed trajectories (``None`` where undefined)."""
    own = np.array([s["own_pi"] for s in shifts], dtype=float)
    foreign = np.array([s["foreign_pi"] for s in shifts], dtype=float)
    by_trajectory: dict[int, list[int]] = {}
    for index, s in enumerate(shifts):
        by_trajectory.setdefault(s["trajectory"], []).append(index)
    groups = list(by_trajectory.values())
    rng = np.random.default_rng(seed)
    replicates = []
    for _ in range(resamples if len(groups) > 1 else 0):
        picked = np.concatenate([groups[g] for g in rng.integers(0, len(groups), len(groups))])
        value = _correlation(own[picked], foreign[picked])
        if value is not None:
            replicates.append(value)
    won = np.array([bool(s["won"]) for s in shifts])
    return {
        "correlation": _correlation(own, foreign),
        "correlation_interval_95": [float(v) for v in np.percentile(replicates, [2.5, 97.5])] if replicates else None,
        "correlation_by_outcome": {"won": _correlation(own[won], foreign[won]),
                                   "failed": _correlation(own[~won], foreign[~won])},
    }


def resummarize(path: Path, argv: list[str] | None) -> dict[str, Any]:
    """Recompute the correlation figures of a written result from its recorded shifts, in place."""
    results = json.loads(path.read_text())
    results.update(correlation_figures(results["shifts"]))
    results["resummarized"] = provenance(argv, __file__)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def _mean(values: torch.Tensor, mask: list[bool], wanted: bool) -> float | None:
    picked = [v for v, m in zip(values.tolist(), mask, strict=True) if m == wanted]
    return sum(picked) / len(picked) if picked else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded:smollm2-135m-alfworld")
    parser.add_argument("--task-types", nargs="+", default=list(DEFAULT_TASK_TYPES), help="one game each; at least 2")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=12)
    parser.add_argument("--max-completion-length", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train", choices=("train", "eval_seen", "eval_unseen"),
                        help="games to script (train: the warm start's own games at seed 0)")
    parser.add_argument("--history-window", type=int, default=None,
                        help="prompt history window (default: the one the warm start was trained with, else 1)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast (--no-bf16: float32; default: where the hardware computes it)")
    parser.add_argument("--out", default="outputs/pi_specificity", help="folder for pi_specificity.json")
    parser.add_argument("--label", default=None, help="the policy's name in the results page (default: --model)")
    parser.add_argument("--resummarize", type=Path, default=None, metavar="JSON",
                        help="recompute the correlation figures of this pi_specificity.json from its shifts; no model")
    args = parser.parse_args(argv)
    if args.resummarize is not None:
        results = resummarize(args.resummarize, argv)
        _print_correlation(results)
        return results
    args.label = args.label or args.model
    if len(args.task_types) < 2:
        parser.error("--task-types needs at least 2 families: a foreign PI comes from another task")
    # what credit_quality's _rows and _config read beyond the options above: its scripted ALFWorld batch
    args.siblings = "scripted"
    args.env = "alfworld"
    cq = _credit_quality()

    model = resolve_policy_path(args.model)
    args.history_window = args.history_window or trained_history_window(model)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        games = generate_games(tmp_dir / "games", 1, args.seed, args.split, task_types=args.task_types)
        rows, plans = cq._rows(games, args)
        trainer = TASPOTrainer(model=model, args=cq._config("taspo", tmp_dir, args), train_dataset=Dataset.from_list(rows))
        trainer.model.train()
        try:
            seen, _ = cq._play(trainer, rows, plans)
            step: StepView = seen["step"]
            own_pi = [
                text if float(a) != 0.0 else ""
                for text, a in zip(trainer.last_step.privileged_info, step.advantages.tolist(), strict=True)
            ]
            own, plain = _action_shifts(trainer, step, own_pi)
            # the same rows are rescored (empty contexts stay empty), so the plain log-probs are own's
            other, _ = _action_shifts(trainer, step, foreign_contexts(own_pi, args.group_size))
        finally:
            trainer.close()

    keys = sorted(set(own) & set(other))
    a = torch.tensor([own[k] for k in keys], dtype=torch.float64)
    b = torch.tensor([other[k] for k in keys], dtype=torch.float64)
    trajectories = step.trajectories
    named = [quoted(trajectories[i].turns[t].action, own_pi[i]) for i, t in keys]
    quoted_keys = [k for k, q in zip(keys, named, strict=True) if q]
    quoted_plain = [plain[k] for k in quoted_keys]
    results = {
        "settings": {**vars(args), "model_path": model},
        "actions": len(keys),
        "mean_abs_shift_own_pi": a.abs().mean().item(),
        "mean_abs_shift_foreign_pi": b.abs().mean().item(),
        "quoted_actions": sum(named),
        "mean_shift_own_pi": {"quoted": _mean(a, named, True), "not_quoted": _mean(a, named, False)},
        "mean_shift_foreign_pi": {"quoted": _mean(b, named, True), "not_quoted": _mean(b, named, False)},
        "gap_share_own_quoted": gap_share([own[k] for k in quoted_keys], quoted_plain),
        "gap_share_foreign_quoted": gap_share([other[k] for k in quoted_keys], quoted_plain),
        "shifts": [
            {"trajectory": i, "turn": t, "won": trajectories[i].won, "action": trajectories[i].turns[t].action,
             "quoted": q, "plain_logprob": plain[(i, t)], "own_pi": own[(i, t)], "foreign_pi": other[(i, t)]}
            for (i, t), q in zip(keys, named, strict=True)
        ],
        "privileged_info": own_pi,
    }
    results.update(correlation_figures(results["shifts"]))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results["provenance"] = provenance(argv, __file__)
    (out_dir / "pi_specificity.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"{len(keys)} actions: mean |shift| {results['mean_abs_shift_own_pi']:.4f} under their own PI, "
          f"{results['mean_abs_shift_foreign_pi']:.4f} under another task's")
    _print_correlation(results)
    own_means, foreign_means = results["mean_shift_own_pi"], results["mean_shift_foreign_pi"]
    print(f"mean shift of the {sum(named)} actions their own PI quotes: {own_means['quoted']} (under another task's "
          f"PI: {foreign_means['quoted']}); of the other {len(named) - sum(named)}: {own_means['not_quoted']} "
          f"({foreign_means['not_quoted']})")
    print(f"share of the quoted actions' gap (-plain log-prob) their shift takes: {results['gap_share_own_quoted']} "
          f"under their own PI, {results['gap_share_foreign_quoted']} under another task's")
    return results


def _print_correlation(results: dict[str, Any]) -> None:
    by_outcome = results["correlation_by_outcome"]
    print(f"correlation of the own and foreign shifts: {results['correlation']} (95 % over trajectories: "
          f"{results['correlation_interval_95']}); within won trajectories {by_outcome['won']}, within failed "
          f"{by_outcome['failed']}")


if __name__ == "__main__":
    main()
