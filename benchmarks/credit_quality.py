"""Credit quality: does each method's per-action credit go to the actions that made progress?

One batch of ALFWorld rollouts (``--games-per-type`` games of every family, ``--group-size`` siblings each) is
played once; then every method's own credit path (its trainer's ``turn_advantages``, the call of one GRPO step)
runs on that same batch, with no training. The games are generated with ``--games-seed`` (default: the quickstarts' seed,
``taspo_trl.warmstart.FRESH_GAMES_SEED``, whose games the warm start never trained on; a JSON's settings name the
seed it played); ``--batches`` plays them again with other samples (batch b samples
with seed ``--seed`` + b) and pools the batches' actions; the JSON keeps each batch's scores too. Each
action is labelled by the planner: it "made progress" when Fast Downward's distance to the goal is shorter after
it than before it (``taspo_trl.envs.alfworld.progress``).

Per method the score is the Mann-Whitney AUC of the action weight against "made progress", pooled over the
successful trajectories and, separately, over the failed ones. The action weight is the turn's advantage divided by
its trajectory's outcome advantage A_i (``taspo_trl.credit.quality.action_weights``; a per-token advantage counts
with its turn mean), so GRPO's weights are all 1 and its AUC is 0.5. Reading the AUC:
- successful trajectories (A_i > 0): above 0.5 means progress actions get more of the reward;
- failed trajectories (A_i < 0): BELOW 0.5 means progress actions get less of the blame.
Trajectories whose A_i is 0 (groups that all won or all failed) carry no outcome credit and are left out.

Siblings (``--siblings``):
- ``sampled``: every sibling is sampled from ``--model`` (the warm-started policy is meant for this);
- ``scripted``: the four plans of ``taspo_trl.testing.walkthrough_plans`` (two walkthrough wins, two
  stalling failures), scored with the model's real log-probs: successes for TASPO even from an untrained model;
- ``mixed``: the two winning plans plus sampled siblings for the rest of each group.
With plans, a game's turn cap is raised to its walkthrough length + 1 where ``--max-turns`` is shorter.

Other environments (``--env``): ``webshop`` and ``search`` play ``--tasks`` train tasks of the embedded catalogue
or question set, every sibling by the environment's oracle with a random action at each turn with probability
``--epsilon`` (``taspo_trl.testing.noisy_oracle_plan``), scored with the real log-probs of ``--model`` (default: the
embedded base model). Their labels: WebShop, the fewest steps left to a purchase scoring 1 went down
(``taspo_trl.envs.webshop.progress``); Search-QA, a search found a fact the answer needs, or the answer was right
(``taspo_trl.envs.search.progress``). The oracle's actions carry no ``<think>`` text, and AlignOPSD matches decision
states by their thinking only (a turn without it is ineligible, as in the official code), so on these siblings its
correspondence finds no source by construction and its credit is GRPO's: that row is not a verdict on the method.
WebShop's pages make its prompts long, so its default is 4 batches of 12 tasks (see below), not Search-QA's 7 of
16.

Each AUC comes with a 95 % interval from a bootstrap that resamples whole task groups (batch, group), since the
actions of a trajectory and the trajectories of a group are not independent, and with the paired difference
against GRPO and against TASPO on the same replicates (``taspo_trl.credit.quality.group_bootstrap_auc``). Next to
each AUC, ``moved`` is the share of trajectories whose weights are not all 1: "no credit moved" (0) and "credit
moved the wrong way" read differently.

How many batches: the defaults aim at an interval that excludes 0.5 four times in five for a method whose true
AUC is 0.6, so 0.1 must be at least (1.96 + 0.84) standard errors: a standard error of 0.036 or less on each side.
The AUC's standard error falls as one over the square root of the task groups with a non-zero advantage on its
side; on ALFWorld about 20 such groups give 0.044, so about 30 are needed, which the default 7 batches of the six
families give with room for the groups that win nothing. Search-QA's default (7 batches of 16 tasks) gives about
89 of 112; WebShop's noisy oracle wins about 3 of 4 siblings, so a group of 4 has a non-zero advantage with
probability 1 - 0.75^4 - 0.25^4 = 0.68, and 48 tasks (4 batches of 12) give about 33. Each JSON records every
batch's seconds per phase; the teacher passes of AlignOPSD and the comparison methods take most of them, so the
default runs in parts (below).
``--quick`` is one batch of two families or 4 tasks with 200 resamples, for smoke runs.

A long setting can run in parts: batch b's rollouts and credit depend only on its sampling seed, so ``--seed 0
--batches 2`` and ``--seed 2 --batches 5`` together play the 7 batches of ``--seed 0``, and ``--merge A.json
B.json --out DIR`` pools them into the result that one run would have written (same table, intervals and
per-batch figures). Runs of other methods on the same seeds join too: their trajectories must be identical, and
each method must score every batch once; ``--leave-out A.json alignopsd`` drops one file's scores of a method that
another file rescored (after a fix), ``--leave-out A.json alignopsd@1-2`` only those of seeds 1 and 2. It refuses
runs that differ in another setting, the precision or the warm start.

Methods whose teacher pass only depends on the privileged context (the BaselineTrainer teachers: at this fixed
batch the initial policy and the rollout snapshot are the same weights) share one pass per distinct context.
Every registered credit method is scored but those of ``NOT_SCORED`` (Skill-GRPO and OPD; it says why).

    python benchmarks/credit_quality.py --model embedded --siblings scripted
    python benchmarks/credit_quality.py --env webshop --methods grpo taspo gigpo
    python benchmarks/credit_quality.py --quick
    python benchmarks/credit_quality.py --merge part1/credit_quality.json part2/credit_quality.json --out pooled
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import Dataset

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl import AgentGRPOTrainer
from taspo_trl.credit.quality import (
    LabelledAction,
    action_weights,
    credit_verdict,
    group_bootstrap_auc,
    mann_whitney_auc,
    moved_share,
)
from taspo_trl.envs.base import task_spec_from_row
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.envs.alfworld.env import read_game_file
from taspo_trl.envs.alfworld.progress import goal_distances, made_progress
from taspo_trl.envs.search import search_task_rows
from taspo_trl.envs.search.progress import search_progress
from taspo_trl.envs.webshop import webshop_task_rows
from taspo_trl.envs.webshop.progress import webshop_distances, webshop_progress
from taspo_trl.precision import choose_precision
from taspo_trl.provenance import provenance, source_commit
from taspo_trl.rollout.loop import run_agent_loop
from taspo_trl.rollout.records import Trajectory
from taspo_trl.credit.turns import TurnCredit
from taspo_trl.testing import PlannedGenerator, noisy_oracle_plan, walkthrough_plans
from taspo_trl.trainers import BaselineTrainer, method_classes, method_names, method_settings
from taspo_trl.warmstart import FRESH_GAMES_SEED, resolve_policy_path, trained_history_window

from results_page import seed_ranges  # the script beside this one (its folder is on the path)

DEFAULT_MODELS = {"alfworld": "embedded:smollm2-135m-alfworld", "webshop": "embedded", "search": "embedded"}
ENVIRONMENTS = tuple(DEFAULT_MODELS)
SIBLINGS = ("sampled", "scripted", "mixed")
POOLS = ("success", "failed")
REFERENCES = ("grpo", "taspo")  # paired differences are taken against these
DEFAULT_SIZES = {"alfworld": {"batches": 7, "tasks": 16}, "webshop": {"batches": 4, "tasks": 12},
                 "search": {"batches": 7, "tasks": 16}}
"""Per environment, the batches pooled and (WebShop, Search-QA) the tasks per batch; see "How many batches"."""


def _defaults(key: str, skip: str = "") -> str:
    return ", ".join(f"{env} {sizes[key]}" for env, sizes in DEFAULT_SIZES.items() if env != skip)


QUICK = {"batches": 1, "task_types": ["pick_and_place_simple", "pick_clean_then_place_in_recep"], "tasks": 4,
         "resamples": 200}

NOT_SCORED = {"skill_grpo": "GRPO's credit; it changes the policy's prompt, hence the rollouts",
              "opd": "needs a larger teacher model"}
METHODS = tuple(name for name in method_names() if name not in NOT_SCORED)
"""The methods scored: every registered method but ``NOT_SCORED``. GRPO comes first: its trainer plays the batch."""


def _config(method: str, out_dir: Path, args: argparse.Namespace, seed: int | None = None) -> Any:
    config_class, _ = method_classes(method)
    settings = method_settings(method)
    return config_class(
        output_dir=str(out_dir / method),
        per_device_train_batch_size=args.group_size,
        num_generations=args.group_size,
        max_completion_length=args.max_completion_length,
        max_turns=None,  # each row carries its own cap (see _rows)
        max_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=args.bf16,
        gradient_checkpointing=False,
        seed=args.seed if seed is None else seed,
        history_window=args.history_window,
        environment=args.env,
        **settings,
    )


def _rows(games: list[Path], args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[list[str | None] | None]]:
    """Dataset rows, ``group_size`` consecutive siblings per game, and each sibling's plan (``None``: sampled)."""
    rows, plans = [], []
    for game, row in zip(games, task_spec_rows(games), strict=True):
        walkthrough = read_game_file(game)["walkthrough"]
        cap = args.max_turns if args.siblings == "sampled" else max(args.max_turns, len(walkthrough) + 1)
        scripted = walkthrough_plans(walkthrough, cap, wins=2)
        for k in range(args.group_size):
            rows.append({**row, "max_turns": cap})
            if args.siblings == "scripted":
                plans.append(scripted[k % len(scripted)])
            elif args.siblings == "mixed" and k < 2:
                plans.append(scripted[k])
            else:
                plans.append(None)
    return rows, plans


def _oracle_rows(args: argparse.Namespace, seed: int) -> tuple[list[dict[str, Any]], list[list[str | None]]]:
    """WebShop or Search-QA rows, ``group_size`` siblings per task, each with its own noisy-oracle plan."""
    build = webshop_task_rows if args.env == "webshop" else search_task_rows
    rows, plans = [], []
    for task, row in enumerate(build(split="train", max_tasks=args.tasks)):
        spec = task_spec_from_row(row)
        for k in range(args.group_size):
            rows.append(dict(row))
            plans.append(noisy_oracle_plan(args.env, spec, random.Random(f"{seed}:{task}:{k}"), args.epsilon))
    return rows, plans


def _loop_with_plans(trainer: Any, plans: list[list[str | None] | None]) -> Callable[..., list[Trajectory]]:
    """The agent loop, with the planned siblings played by a ``PlannedGenerator`` and the others by the trainer's
    own sampler. Two loops over the two subsets, since a planned sibling's episode length is fixed by its plan and
    a sampled one's is not; the trainer numbers the groups afterwards from the row order, which is kept."""

    def loop(task_specs: list[dict[str, Any]], pool: Any, generate: Any, chat: Any, **kwargs: Any) -> list[Trajectory]:
        planned = [k for k, plan in enumerate(plans) if plan is not None]
        sampled = [k for k, plan in enumerate(plans) if plan is None]
        scripted = PlannedGenerator(trainer.model, trainer.processing_class, [plans[k] for k in planned], trainer.args.temperature)
        out: list[Trajectory | None] = [None] * len(task_specs)
        for keys, generator in ((planned, scripted), (sampled, generate)):
            if keys:
                played = run_agent_loop([task_specs[k] for k in keys], pool, generator, chat, **kwargs)
                for k, trajectory in zip(keys, played, strict=True):
                    out[k] = trajectory
        return out

    return loop


def _play(trainer: AgentGRPOTrainer, rows: list[dict[str, Any]], plans: list) -> tuple[dict[str, Any], list]:
    """One GRPO step's rollout and credit on ``rows``; returns the inputs its ``turn_advantages`` saw and its output."""
    seen: dict[str, Any] = {}
    own = trainer.turn_advantages

    def spy(step):
        seen.update(step=step, trajectories=step.trajectories, advantages=step.advantages)
        seen["credit"] = own(step)
        return seen["credit"]

    trainer.turn_advantages = spy
    patched = grpo_module.run_agent_loop
    if any(plan is not None for plan in plans):
        grpo_module.run_agent_loop = _loop_with_plans(trainer, plans)
    try:
        trainer._generate_and_score_completions([dict(row) for row in rows])
    finally:
        grpo_module.run_agent_loop = patched
        trainer.turn_advantages = own
    return seen, seen.pop("credit")


def _labels(trajectories: list[Trajectory], env: str = "alfworld") -> list[dict[str, Any]]:
    """Every trajectory's progress labels, from its own commands (``""`` where the loop sent no valid action):
    ALFWorld's planner distances, WebShop's fewest steps to the goal purchase, Search-QA's found facts."""
    games: dict[str, dict[str, Any]] = {}
    out = []
    for i, trajectory in enumerate(trajectories):
        commands = [turn.action if turn.action_valid else "" for turn in trajectory.turns]  # as the loop sent them
        if env == "search":
            observations = [turn.observation for turn in trajectory.turns]
            out.append({"commands": commands, "progress": search_progress(trajectory.task_spec, commands, observations)})
            continue
        if env == "webshop":
            distances = webshop_distances(trajectory.task_spec, commands)
            progress = webshop_progress(distances)
        else:
            game_file = trajectory.task_spec["game_file"]
            game = games.setdefault(game_file, read_game_file(game_file))
            distances = goal_distances(game, commands)
            progress = made_progress(distances)
        if (distances[-1] == 0) != trajectory.won:
            raise RuntimeError(f"trajectory {i}: the replay ends at distance {distances[-1]} but won={trajectory.won}")
        out.append({"commands": commands, "distances": distances, "progress": progress})
    return out


def _shared_teacher_scores(trainer: BaselineTrainer, memo: dict) -> None:
    """Reuse the teacher pass of an earlier method with the same contexts (see the module docstring)."""
    own = trainer._teacher_scores

    def scores(trajectories, contexts):
        key = tuple(contexts.items())
        if key not in memo:
            memo[key] = own(trajectories, contexts)
        return memo[key]

    trainer._teacher_scores = scores


def _method_credit(
    method: str, model: str, dataset: Dataset, seen: dict[str, Any], out_dir: Path, args: argparse.Namespace,
    seed: int, memo: dict,
) -> TurnCredit:
    """``method``'s per-turn advantages on the played batch, from a trainer of its own on the same weights."""
    _, trainer_class = method_classes(method)
    trainer = trainer_class(model=model, args=_config(method, out_dir, args, seed), train_dataset=dataset)
    trainer.model.train()  # a training step's mode: metrics and group sizes read it
    if isinstance(trainer, BaselineTrainer):
        _shared_teacher_scores(trainer, memo)
    try:
        return trainer.turn_advantages(seen["step"])
    finally:
        trainer.close()


def score(weights: list[list[float] | None], won: list[bool], progress: list[list[bool | None]]) -> dict[str, Any]:
    """Per pool (successful / failed trajectories): the AUC of the action weights against progress, the counts,
    and the mean weight of progress and other actions. ``weights[i]``: trajectory i's action weights (``None``
    when its A_i is 0: left out); ``progress[i]``: its actions' labels (``None``: unlabelled, left out)."""
    pools: dict[str, tuple[list[float], list[bool]]] = {pool: ([], []) for pool in POOLS}
    for per_action, success, labels in zip(weights, won, progress, strict=True):
        if per_action is None:
            continue
        scores, flags = pools["success" if success else "failed"]
        for weight, label in zip(per_action, labels, strict=True):
            if label is not None:
                scores.append(weight)
                flags.append(label)
    out = {}
    for pool, (scores, flags) in pools.items():
        progressed = [s for s, f in zip(scores, flags) if f]
        other = [s for s, f in zip(scores, flags) if not f]
        out[pool] = {
            "auc": mann_whitney_auc(scores, flags),
            "progress_actions": len(progressed),
            "other_actions": len(other),
            "mean_weight_progress": sum(progressed) / len(progressed) if progressed else None,
            "mean_weight_other": sum(other) / len(other) if other else None,
        }
    return out


def bootstrap(
    weights: dict[str, list[list[float] | None]], won: list[bool], progress: list[list[bool | None]],
    groups: list[Any], resamples: int, seed: int,
) -> dict[str, Any]:
    """Per pool, every method's AUC interval and its paired differences against ``REFERENCES``, resampling task
    groups. ``weights[m][i]``: trajectory i's action weights under method m (``None`` when its A_i is 0);
    ``groups[i]``: its task group (batch, group)."""
    methods = list(weights)
    references = [r for r in REFERENCES if r in weights]
    out = {}
    for pool in POOLS:
        actions = [
            LabelledAction(groups[i], {m: weights[m][i][t] for m in methods}, label)
            for i, (success, labels) in enumerate(zip(won, progress, strict=True))
            if weights["grpo"][i] is not None and success == (pool == "success")
            for t, label in enumerate(labels) if label is not None
        ]
        out[pool] = group_bootstrap_auc(actions, methods, references, resamples=resamples, seed=seed)
    return out


def pooled_entries(weights: dict[str, list[list[float] | None]], won: list[bool],
                   progress: list[list[bool | None]], groups: list[Any], resamples: int, seed: int) -> dict[str, Any]:
    """What the JSON keeps of the pooled actions: per method its scores, intervals and moved shares, and the
    bootstrap's settings."""
    intervals = bootstrap(weights, won, progress, groups, resamples, seed)
    per_method = {
        m: {
            "scores": score(weights[m], won, progress),
            "intervals": {pool: intervals[pool].as_dict()["methods"][m] for pool in POOLS},
            "moved": {pool: moved_share([w for w, success in zip(weights[m], won) if success == (pool == "success")])
                      for pool in POOLS},
        }
        for m in weights
    }
    settings = {"unit": "task group (batch, group)", "resamples": resamples,
                "kept": {pool: intervals[pool].kept for pool in POOLS}}
    return {"methods": per_method, "bootstrap": settings}


def rescore(path: Path, resamples: int, seed: int) -> dict[str, Any]:
    """Add the intervals to a result file written before they existed, from the trajectories it holds (their
    weights and labels); a trajectory's group is its recorded one, else (its batch, its game)."""
    results = json.loads(path.read_text())
    trajectories = results["trajectories"]
    per_batch = len(trajectories) // max(1, int(results["settings"].get("batches", 1)))
    groups = [tuple(t["group"]) if "group" in t else (i // per_batch, t["game"]) for i, t in enumerate(trajectories)]
    weights = {m: [t["weights"][m] for t in trajectories] for m in results["methods"]}
    added = pooled_entries(weights, [t["won"] for t in trajectories], [t["progress"] for t in trajectories],
                             groups, resamples, seed)
    for method, entry in added["methods"].items():
        results["methods"][method].update(entry)
    results["bootstrap"] = {**added["bootstrap"], "added": "afterwards, from this file's trajectories (--rescore)"}
    path.write_text(json.dumps(results, indent=1) + "\n")
    _print_table(results)
    return results


MERGE_FREE_SETTINGS = ("seed", "batches", "methods", "out", "rescore", "merge", "leave_out", "resamples", "bf16",
                       "model_path")
"""Settings that may differ between the runs ``--merge`` pools: which batches each played and which methods scored
them, where it wrote, its bootstrap, and how the precision and the model were asked for (the precision and the
warm start themselves are compared)."""
PLAYED = ("game", "won", "advantage", "commands", "progress")
"""What makes two records one trajectory: the same batch seed played it the same way (in the same group of its
batch; the batch's own index depends on the run, see ``_played``)."""


def _played(trajectories: list[dict[str, Any]]) -> list[list[Any]]:
    # A trajectory's group is (batch index in its run, group in the batch): a seed played as the second batch of
    # one run and as the only batch of another is the same batch.
    return [[t["group"][1], *(t[k] for k in PLAYED)] for t in trajectories]


def _merge_batches(runs: list[tuple[dict[str, Any], Path]]) -> dict[int, dict[str, Any]]:
    """Every batch of ``runs`` by its sampling seed. A seed in several runs must have been played identically in
    each (the same trajectories, labels and outcome advantages), and each method other than GRPO may score it in
    one run only: their weights are joined."""
    batches: dict[int, dict[str, Any]] = {}
    for run, path in runs:
        for b, entry in enumerate(run["per_batch"]):
            trajectories = [json.loads(json.dumps(t)) for t in run["trajectories"] if t["group"][0] == b]
            seed = entry["seed"]
            if seed not in batches:
                batches[seed] = {"entry": json.loads(json.dumps(entry)), "trajectories": trajectories,
                                 "seconds": dict(run["seconds"][b]), "path": path}
                continue
            known = batches[seed]
            if _played(trajectories) != _played(known["trajectories"]):
                raise SystemExit(f"--merge: the batch with seed {seed} was played differently in {known['path']} and "
                                 f"{path} (other trajectories or labels); only runs of the same code can be joined.")
            twice = sorted((set(entry["methods"]) & set(known["entry"]["methods"])) - {"grpo"})
            if twice:
                raise SystemExit(f"--merge: the batch with seed {seed} is scored by {twice} in both {known['path']} "
                                 f"and {path}; it would count twice (--leave-out JSON METHOD keeps one of them).")
            for mine, theirs in zip(known["trajectories"], trajectories, strict=True):
                mine["weights"].update(theirs["weights"])
            known["entry"]["methods"].update(entry["methods"])
            known["seconds"].update({k: v for k, v in run["seconds"][b].items() if k not in known["seconds"]})
    return batches


def _leave_out(runs: list[tuple[dict[str, Any], Path]], left_out: list[tuple[str, str]]) -> None:
    """Remove each (file, method) of ``left_out`` from that run's scores, so a method rescored by a later run (after
    a fix, say) is pooled from the later run only. ``METHOD@SEEDS`` (``alignopsd@1-2``, ``taspo@0,3``) removes
    only those batches' scores."""
    for file, spec in left_out:
        method, _, seed_text = spec.partition("@")
        matches = [run for run, path in runs if path.resolve() == Path(file).resolve()]
        if not matches:
            raise SystemExit(f"--leave-out: {file} is not one of the --merge files.")
        run = matches[0]
        if method == "grpo" or method not in run["settings"]["methods"]:
            raise SystemExit(f"--leave-out: {file} has no {method} scores to leave out "
                             f"(it scored {[m for m in run['settings']['methods'] if m != 'grpo']}; GRPO always stays).")
        played = [batch["seed"] for batch in run["per_batch"]]
        try:
            seeds = _parse_seed_ranges(seed_text) if seed_text else played
        except ValueError:
            raise SystemExit(f"--leave-out: cannot read the seeds of {spec!r}; write METHOD@SEEDS as alignopsd@1-2 "
                             "or alignopsd@0,3.") from None
        if set(seeds) - set(played):
            unplayed = seed_ranges(sorted(set(seeds) - set(played)))
            raise SystemExit(f"--leave-out: {file} played no batch with seed {unplayed} (its seeds: {seed_ranges(played)}).")
        if set(seeds) == set(played):
            run["settings"]["methods"] = [m for m in run["settings"]["methods"] if m != method]
        batches = [b for b, seed in enumerate(played) if seed in seeds]
        for b in batches:
            run["per_batch"][b]["methods"].pop(method, None)
            run["seconds"][b].pop(method, None)
        for trajectory in run["trajectories"]:
            if trajectory["group"][0] in batches:
                trajectory["weights"].pop(method)


def _parse_seed_ranges(text: str) -> list[int]:
    """``"0-2, 4"`` or ``"0-2,4"`` as ``[0, 1, 2, 4]``: the inverse of ``results_page.seed_ranges``."""
    seeds = []
    for span in text.split(","):
        bounds = span.strip().split("-")
        if len(bounds) > 2 or not all(b.isdigit() for b in bounds):
            raise ValueError(f"not a seed range: {span!r}")
        seeds.extend(range(int(bounds[0]), int(bounds[-1]) + 1))
    return seeds


def _precision_fields(args: argparse.Namespace, batches: int) -> dict[str, Any]:
    """A run's ``precision`` ("bf16 autocast" or "float32") and ``precision_reasons``: why it was chosen, with the
    batches (their seeds) it played and the methods it scored (GRPO only where it scored nothing else)."""
    precision = choose_precision(args.bf16, use_cpu=True)
    methods = [m for m in args.methods if m != "grpo"] or ["grpo"]
    return {"precision": precision.name,
            "precision_reasons": [{"reason": precision.reason, "seeds": [args.seed + b for b in range(batches)],
                                   "methods": methods}]}


def _merged_precision_reasons(runs: list[tuple[dict[str, Any], Path]]) -> list[dict[str, Any]]:
    """The runs' ``precision_reasons`` pooled by reason (the precision itself must agree; the reason may differ:
    auto on a CPU without bf16 instructions, ``--no-bf16`` on one with them), each with every seed it played and
    method it scored, in the order of their first seed."""
    by_reason: dict[str, tuple[set[int], set[str]]] = {}
    for run, _ in runs:
        for part in run["precision_reasons"]:
            seeds, methods = by_reason.setdefault(part["reason"], (set(), set()))
            seeds.update(part["seeds"])
            methods.update(part["methods"])
    return [{"reason": reason, "seeds": sorted(seeds), "methods": [m for m in METHODS if m in methods]}
            for reason, (seeds, methods) in sorted(by_reason.items(), key=lambda item: min(item[1][0]))]


def merge(paths: list[Path], out_dir: Path, resamples: int, argv: list[str] | None,
          left_out: list[tuple[str, str]] = ()) -> dict[str, Any]:
    """Pool the batches of several runs of one setting into the result that one run would have written. A long
    default setting can run in parts: other batches (``--seed 2 --batches 5`` after ``--seed 0 --batches 2``),
    since batch b's rollouts and credit depend only on its sampling seed, and other methods on the same batches
    (their trajectories must then be identical). The runs must agree on every setting but ``MERGE_FREE_SETTINGS``,
    on the precision and on the warm start, and every method must score every batch; ``left_out`` names (file,
    method) scores not to pool. The bootstrap is seeded with the first batch's seed, as a single run's is."""
    runs = [(json.loads(p.read_text()), p) for p in paths]
    _leave_out(runs, list(left_out))
    first, first_path = min(runs, key=lambda run: min(b["seed"] for b in run[0]["per_batch"]))
    for run, path in runs:
        for key in sorted(set(first["settings"]) | set(run["settings"])):
            if key not in MERGE_FREE_SETTINGS and run["settings"].get(key) != first["settings"].get(key):
                raise SystemExit(f"--merge: {path} has {key}={run['settings'].get(key)!r} but {first_path} has "
                                 f"{first['settings'].get(key)!r}; only runs of one setting can be pooled.")
        if run["warm_start_fingerprint"] != first["warm_start_fingerprint"]:
            raise SystemExit(f"--merge: {path} and {first_path} used different warm starts (their fingerprints differ).")
        if run["precision"] != first["precision"]:
            raise SystemExit(f"--merge: {path} ran in {run['precision']} but {first_path} in {first['precision']}; "
                             "pool runs of one precision.")
    batches = _merge_batches(runs)
    seeds = sorted(batches)
    methods = [m for m in METHODS if any(m in batches[seed]["entry"]["methods"] for seed in seeds)]
    missing = [(seed, m) for seed in seeds for m in methods if m not in batches[seed]["entry"]["methods"]]
    if missing:
        raise SystemExit(f"--merge: every method must score every batch; missing (seed, method): {missing}.")
    trajectories = [  # a trajectory's group is (batch, group): the batches renumbered in seed order
        {**t, "group": [b, t["group"][1]], "weights": {m: t["weights"][m] for m in methods}}
        for b, seed in enumerate(seeds) for t in batches[seed]["trajectories"]
    ]
    weights = {m: [t["weights"][m] for t in trajectories] for m in methods}
    won = [t["won"] for t in trajectories]
    pooled = pooled_entries(weights, won, [t["progress"] for t in trajectories],
                            [tuple(t["group"]) for t in trajectories], resamples, seeds[0])
    per_batch = [{**batches[seed]["entry"], "methods": {m: batches[seed]["entry"]["methods"][m] for m in methods}}
                 for seed in seeds]
    results = {
        "settings": {**first["settings"], "seed": seeds[0], "batches": len(seeds), "methods": methods,
                     "out": str(out_dir), "merge": [str(p) for p in paths], "resamples": resamples,
                     "leave_out": [list(pair) for pair in left_out]},
        "precision": first["precision"],
        "precision_reasons": _merged_precision_reasons(runs),
        "warm_start_fingerprint": first["warm_start_fingerprint"],
        "batch": _batch_summary([t["advantage"] for t in trajectories], won, trajectories),
        "seconds": [batches[seed]["seconds"] for seed in seeds],
        "bootstrap": pooled["bootstrap"],
        "methods": pooled["methods"],
        "per_batch": per_batch,
        "trajectories": trajectories,
        "provenance": {**provenance(argv, __file__),
                       "merged_from": [{"file": str(path), **run["provenance"]} for run, path in runs]},
    }
    settings = results["settings"]
    title = (f"{settings['env']}, {Path(settings['model']).name}, {settings['siblings']} siblings, "
             f"{len(trajectories)} trajectories ({sum(won)} won), {len(seeds)} batches from {len(runs)} runs")
    return _save(results, out_dir, title)


def _save(results: dict[str, Any], out_dir: Path, title: str) -> dict[str, Any]:
    """Write the JSON and the plot into ``out_dir``, print the table, and return ``results``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "credit_quality.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out_dir / "credit_quality.png", title)
    _print_table(results)
    return results


def _task_name(spec: dict[str, Any], game_names: dict[str, str]) -> str:
    if "game_file" in spec:
        return game_names[spec["game_file"]]
    return str(spec.get("id", spec.get("goal_index", spec.get("task", ""))))


def warm_start_fingerprint(model_dir: str) -> str | None:
    """A short hash of the warm start's recorded fingerprint (its settings and the code that made its data), so
    two results can be told to come from the same build; ``None`` for a model that is not a warm start."""
    record = Path(model_dir) / "warm_start.json"
    if not record.is_file():
        return None
    fingerprint = json.loads(record.read_text()).get("fingerprint")
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(results["methods"])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(methods) + 2), 4))
    width = 0.38
    for offset, pool, label in ((-width / 2, "success", "successful (good: > 0.5)"), (width / 2, "failed", "failed (good: < 0.5)")):
        values = [results["methods"][m]["scores"][pool]["auc"] for m in methods]
        bounds = [results["methods"][m]["intervals"][pool]["auc"] for m in methods]
        shown = [k for k, v in enumerate(values) if v is not None]
        errors = [[values[k] - (bounds[k]["low"] if bounds[k]["low"] is not None else values[k]) for k in shown],
                  [(bounds[k]["high"] if bounds[k]["high"] is not None else values[k]) - values[k] for k in shown]]
        ax.bar([k + offset for k in shown], [values[k] for k in shown], width, yerr=errors, capsize=3, label=label)
        for k, v in enumerate(values):
            top = 0.02 if v is None else (bounds[k]["high"] or v) + 0.01
            ax.text(k + offset, top, "n/a" if v is None else f"{v:.2f}", ha="center", fontsize=7)
    ax.axhline(0.5, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("AUC vs. made progress (95 % interval)")
    ax.set_title(textwrap.fill(title, 70), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="alfworld", choices=ENVIRONMENTS)
    parser.add_argument("--model", default=None,
                        help="policy (default: the warm-started embedded policy on ALFWorld, the embedded model elsewhere)")
    parser.add_argument("--siblings", default="sampled", choices=SIBLINGS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--games-per-type", type=int, default=1, help="games of each of the six families")
    parser.add_argument("--task-types", nargs="+", default=None, help="only these families")
    parser.add_argument("--group-size", type=int, default=4, help="siblings per game")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--games-seed", type=int, default=FRESH_GAMES_SEED,
                        help="seed of the generated train games (default: the quickstarts', never in the warm start's data)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the first batch")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches to play on the same games and pool, batch b sampled with seed --seed + b "
                             f"(default per environment: {_defaults('batches')})")
    parser.add_argument("--tasks", type=int, default=None,
                        help=f"WebShop / Search-QA: train tasks per batch (default: {_defaults('tasks', skip='alfworld')})")
    parser.add_argument("--epsilon", type=float, default=0.3,
                        help="WebShop / Search-QA: probability of a random action at each turn of a sibling")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap replicates for the intervals")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke setting: 1 batch, 2 ALFWorld families or 4 tasks, 200 resamples")
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None,
        help="sample and score under bf16 autocast (--no-bf16: float32; default: where the hardware computes it, as the CPU quickstarts do)",
    )
    parser.add_argument("--history-window", type=int, default=None,
                        help="prompt history window (default: the one the warm start was trained with, else 1)")
    parser.add_argument("--out", default="outputs/credit_quality", help="folder for credit_quality.json and .png")
    parser.add_argument("--rescore", type=Path, default=None, metavar="JSON",
                        help="only add the intervals to an earlier result file, from its trajectories")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="only pool earlier runs of one setting (other seeds, or other methods on the same seeds) into --out")
    parser.add_argument("--leave-out", nargs=2, action="append", default=[], metavar=("JSON", "METHOD"),
                        help="with --merge: do not pool METHOD's scores from the file JSON (another file rescored it); "
                             "METHOD@SEEDS (alignopsd@1-2) leaves out only those batches")
    args = parser.parse_args(argv)
    if args.leave_out and not args.merge:
        parser.error("--leave-out only applies to --merge")
    if args.merge:
        return merge(args.merge, Path(args.out), args.resamples, argv, [tuple(pair) for pair in args.leave_out])
    if args.rescore:
        return rescore(args.rescore, args.resamples, args.seed)
    if args.quick:  # the quick setting fills in what the command line left at its default
        vars(args).update({k: v for k, v in QUICK.items() if getattr(args, k) == parser.get_default(k)})
    vars(args).update({k: v for k, v in DEFAULT_SIZES[args.env].items() if getattr(args, k) is None})
    if args.env != "alfworld" and args.siblings == "sampled":
        args.siblings = "scripted"  # the embedded model cannot win WebShop or Search-QA: noisy-oracle siblings
    args.model = args.model or DEFAULT_MODELS[args.env]
    if "grpo" not in args.methods:
        args.methods = ["grpo", *args.methods]  # GRPO's trainer plays the batch

    started_at = source_commit(__file__)  # the code that plays the batches, whatever HEAD is at the end
    model = resolve_policy_path(args.model)  # builds the warm start on first use
    args.history_window = args.history_window or trained_history_window(model)  # the prompts it was trained on
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = []
    with tempfile.TemporaryDirectory() as tmp:
        games = [] if args.env != "alfworld" else generate_games(
            Path(tmp) / "games", args.games_per_type, args.games_seed, "train", task_types=args.task_types)
        names = {str(g): str(g.parent.parent.name) for g in games}  # the family-object-receptacle-scene folder
        for b in range(args.batches):
            print(f"batch {b + 1} of {args.batches} (sampling seed {args.seed + b})", flush=True)
            batches.append(play_batch(model, args, games, args.seed + b))

    # Pooled over batches: every trajectory, in batch order, with its batch's credit from every method.
    trajectories, advantages, won, labels, plans = (
        [item for batch in batches for item in batch[key]]
        for key in ("trajectories", "advantages", "won", "labels", "plans")
    )
    credit = {m: [c for batch in batches for c in batch["credit"][m]] for m in args.methods}
    groups = [(b, t.group) for b, batch in enumerate(batches) for t in batch["trajectories"]]
    weights = {m: [action_weights(c, a) for c, a in zip(credit[m], advantages, strict=True)] for m in credit}
    progress = [label["progress"] for label in labels]
    pooled = pooled_entries(weights, won, progress, groups, args.resamples, args.seed)
    starts = [sum(len(batch["won"]) for batch in batches[:b]) for b in range(len(batches) + 1)]
    results: dict[str, Any] = {
        "settings": {**vars(args), "model_path": model, "games": list(names.values())},
        **_precision_fields(args, len(batches)),
        "warm_start_fingerprint": warm_start_fingerprint(model),
        "batch": _batch_summary(advantages, won, labels),
        "seconds": [batch["seconds"] for batch in batches],
        "bootstrap": pooled["bootstrap"],
        "methods": pooled["methods"],
        "per_batch": [
            {
                "seed": args.seed + b,
                **_batch_summary(batch["advantages"], batch["won"], batch["labels"]),
                "methods": {m: score(weights[m][start:end], won[start:end], progress[start:end]) for m in credit},
            }
            for b, (batch, start, end) in enumerate(zip(batches, starts, starts[1:]))
        ],
        "trajectories": [
            {
                "game": _task_name(t.task_spec, names), "group": list(group), "won": t.won, "advantage": a,
                "planned": plan is not None, **label,
                "weights": {m: weights[m][i] for m in credit},
            }
            for i, (t, a, label, plan, group) in enumerate(zip(trajectories, advantages, labels, plans, groups))
        ],
    }
    results["provenance"] = provenance(argv, __file__, commit=started_at)
    title = f"{args.env}, {Path(args.model).name}, {args.siblings} siblings, {len(trajectories)} trajectories ({sum(won)} won)"
    return _save(results, out_dir, title)


def play_batch(model: str, args: argparse.Namespace, games: list[Path], seed: int) -> dict[str, Any]:
    """One batch: ``games`` (ALFWorld) or ``--tasks`` tasks, ``--group-size`` siblings each, played once by GRPO's
    trainer with sampling seed ``seed``, labelled, and credited by every method of ``--methods``."""
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        rows, plans = _rows(games, args) if args.env == "alfworld" else _oracle_rows(args, seed)
        dataset = Dataset.from_list(rows)

        started = time.perf_counter()
        player = AgentGRPOTrainer(model=model, args=_config("grpo", tmp_dir, args, seed), train_dataset=dataset)
        player.model.train()
        try:
            seen, grpo_credit = _play(player, rows, plans)
        finally:
            player.close()
        seconds["rollout_and_grpo"] = time.perf_counter() - started
        print(f"rollout and GRPO credit: {seconds['rollout_and_grpo']:.1f} s", flush=True)
        trajectories = seen["trajectories"]
        advantages = [float(a) for a in seen["advantages"]]

        started = time.perf_counter()
        labels = _labels(trajectories, args.env)
        seconds["labels"] = time.perf_counter() - started

        credit = {"grpo": grpo_credit}
        memo: dict = {}
        if any(a != 0.0 for a in advantages):  # otherwise no method has outcome credit to place
            for method in args.methods:
                if method != "grpo":
                    started = time.perf_counter()
                    credit[method] = _method_credit(method, model, dataset, seen, tmp_dir, args, seed, memo)
                    seconds[method] = time.perf_counter() - started
                    print(f"{method}: credit in {seconds[method]:.1f} s", flush=True)
        else:  # no outcome credit to redistribute: every method's advantages are GRPO's zeros, none is scored
            credit.update({method: grpo_credit for method in args.methods})
    return {
        "trajectories": trajectories, "advantages": advantages, "won": [t.won for t in trajectories],
        "labels": labels, "plans": plans, "credit": credit, "seconds": seconds,
    }


def _batch_summary(advantages: list[float], won: list[bool], labels: list[dict[str, Any]]) -> dict[str, Any]:
    """Trajectory counts, and the fraction of scored actions that made progress in each pool."""
    scored = [(advantage != 0.0, success, label) for advantage, success, label in zip(advantages, won, labels)]
    return {
        "trajectories": len(advantages),
        "won": sum(won),
        "nonzero_advantage": sum(nonzero for nonzero, _, _ in scored),
        **{
            f"{pool}_progress_fraction": _fraction(
                [p for nonzero, success, label in scored if nonzero and success == (pool == "success")
                 for p in label["progress"] if p is not None]
            )
            for pool in POOLS
        },
    }


def _fraction(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _cell(value: float | None, interval: dict[str, float | None]) -> str:
    if value is None:
        return "n/a"
    if interval["low"] is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"


def _print_table(results: dict[str, Any]) -> None:
    batch = results["batch"]
    print(f"{batch['trajectories']} trajectories, {batch['won']} won, {batch['nonzero_advantage']} with A != 0")
    print("| method | AUC won [95 %] | moved | verdict | AUC failed [95 %] | moved | verdict | won - GRPO | failed - GRPO |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method, entry in results["methods"].items():
        cells = []
        for pool in POOLS:
            auc = entry["intervals"][pool]["auc"]
            moved = entry["moved"][pool]
            cells += [_cell(entry["scores"][pool]["auc"], auc), "n/a" if moved is None else f"{moved:.2f}",
                      credit_verdict(pool, auc["low"], auc["high"], moved)]
        for pool in POOLS:
            diff = entry["intervals"][pool].get("minus_grpo")
            cells.append("-" if diff is None else _cell(diff["estimate"], diff))
        print(f"| {method} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
