"""Coverage of the rule-based analyzer's aligned PI (`pi/coverage`: the share of trajectories that get PI) on
rollouts of the real embedded WebShop and Search-QA environments.

Each task gets `--siblings` rollouts played by the environment's oracle with noise: at every turn, with
probability `--epsilon`, a random action instead (WebShop: a random clickable of the page, or a search for
random words of the instruction; Search-QA: a search for random words of the question, or one of them as the
answer). Random turns use up the turn limit or buy, search and answer the wrong thing, so groups mix successes
and failures as sampled groups do. The siblings' actions are then replayed through the agent loop
(`run_agent_loop`, with `PlannedGenerator` scoring the responses on a tiny random-weight model that has the
embedded tokenizer), so the trajectories are what training records, and the PI is built as `TASPOTrainer`
builds it (`build_batch_pi`, `pi_source: aligned`, `analyzer: rule`, the paper's budgets).

    python benchmarks/pi_coverage.py --env webshop --tasks 16 --siblings 8 --epsilon 0.3
    python benchmarks/pi_coverage.py --env search --tasks 128 --siblings 8 --epsilon 0.3
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from taspo_trl.envs import get_env_factory
from taspo_trl.envs.base import task_spec_from_row
from taspo_trl.envs.search import search_task_rows
from taspo_trl.envs.webshop import webshop_task_rows
from taspo_trl.models import EMBEDDED_MODEL
from taspo_trl.warmstart import resolve_policy_path
from taspo_trl.privileged import RuleBasedAnalyzer, build_batch_pi
from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.env_pool import EnvPool
from taspo_trl.rollout.loop import run_agent_loop
from taspo_trl.rollout.records import Trajectory
from taspo_trl.testing import PlannedGenerator, make_tiny_model_dir, noisy_oracle_plan


ENVS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "webshop": lambda tasks: webshop_task_rows(split="train", max_tasks=tasks),
    "search": lambda tasks: search_task_rows(split="train", max_tasks=tasks),
}


def rollouts(env: str, tasks: int, siblings: int, epsilon: float, seed: int, model_dir: str) -> list[Trajectory]:
    specs = [task_spec_from_row(row) for row in ENVS[env](tasks) for _ in range(siblings)]
    plans = [noisy_oracle_plan(env, spec, random.Random(f"{seed}:{k}"), epsilon) for k, spec in enumerate(specs)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generator = PlannedGenerator(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer, plans)
    pool = EnvPool(get_env_factory(env))
    try:
        return run_agent_loop(specs, pool, generator, ChatFormat(tokenizer), group_size=siblings)
    finally:
        pool.shutdown()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(ENVS), required=True)
    parser.add_argument("--tasks", type=int, default=16, help="task groups (Table C.2: 16 WebShop, 128 Search-QA)")
    parser.add_argument("--siblings", type=int, default=8, help="rollouts per task (the paper's 8)")
    parser.add_argument("--epsilon", type=float, default=0.3, help="probability of a random action at each turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model_dir(tmp, tokenizer_source=resolve_policy_path(EMBEDDED_MODEL))
        trajectories = rollouts(args.env, args.tasks, args.siblings, args.epsilon, args.seed, model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    started = time.perf_counter()
    texts, stats = build_batch_pi(trajectories, args.siblings, RuleBasedAnalyzer(), tokenizer, "aligned")
    seconds = time.perf_counter() - started
    groups = [trajectories[g : g + args.siblings] for g in range(0, len(trajectories), args.siblings)]
    in_mixed = [k for k, t in enumerate(trajectories) if any(s.won for s in groups[k // args.siblings])]
    lengths = [len(tokenizer.encode(text, add_special_tokens=False)) for text in texts if text]
    figures = {
        "env": args.env, "tasks": args.tasks, "siblings": args.siblings, "epsilon": args.epsilon, "seed": args.seed,
        "trajectories": len(trajectories),
        "success_rate": sum(t.won for t in trajectories) / len(trajectories),
        "groups_with_a_success": sum(any(t.won for t in group) for group in groups),
        "pi/coverage": stats.coverage,
        "coverage_in_groups_with_a_success": sum(bool(texts[k]) for k in in_mixed) / max(len(in_mixed), 1),
        "coverage_of_failures_in_those_groups": _share([bool(texts[k]) for k in in_mixed if not trajectories[k].won]),
        "coverage_of_successes": _share([bool(texts[k]) for k in in_mixed if trajectories[k].won]),
        "mean_pi_tokens": sum(lengths) / max(len(lengths), 1),
        "accepted_items": stats.accepted_items, "aligned_statements": stats.aligned_statements,
        "fallbacks": dict(stats.fallbacks), "rejections": dict(stats.rejections), "pi_seconds": round(seconds, 3),
    }
    print(json.dumps(figures, indent=1))
    example = next((k for k in in_mixed if texts[k] and not trajectories[k].won), None)
    if example is not None:
        actions = " | ".join(turn.action or "(invalid)" for turn in trajectories[example].turns)
        print(f"\nA failed target ({trajectories[example].task!r}): {actions}\n{texts[example]}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(figures, handle, indent=1)
    return figures


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


if __name__ == "__main__":
    main()
