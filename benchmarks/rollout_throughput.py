"""Rollout throughput: the batched agent loop against a one-trajectory-at-a-time loop.

Both loops play the same ALFWorld games with the same model and settings; the only difference is whether
the live trajectories of a turn are generated in one batched call or one by one. Reports env steps/s and
generated tokens/s of each, and the ratio, in one run:

    python benchmarks/rollout_throughput.py --trajectories 16 --max-turns 3 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from taspo_trl.envs.alfworld import alfworld_env_factory, generate_games
from taspo_trl.models import EMBEDDED_MODEL
from taspo_trl.warmstart import resolve_policy_path
from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.env_pool import EnvPool
from taspo_trl.rollout.generation import TransformersGenerator
from taspo_trl.rollout.loop import run_agent_loop


def _measure(specs, pool, generator, chat, max_turns, one_at_a_time: bool) -> tuple[float, int, int]:
    torch.manual_seed(0)
    started = time.perf_counter()
    batches = [[spec] for spec in specs] if one_at_a_time else [specs]
    trajectories = []
    for batch in batches:
        trajectories += run_agent_loop(batch, pool, generator, chat, layout="turn", max_turns=max_turns)
    seconds = time.perf_counter() - started
    steps = sum(t.num_turns for t in trajectories)
    tokens = sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    return seconds, steps, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = resolve_policy_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chat = ChatFormat(tokenizer)
    with tempfile.TemporaryDirectory() as games_dir:
        games = sorted(generate_games(games_dir, per_type=max(1, args.trajectories // 6 + 1), seed=0, split="train"))
        specs = [{"game_file": str(games[k % len(games)])} for k in range(args.trajectories)]
        pool = EnvPool(alfworld_env_factory)
        generator = TransformersGenerator(model, tokenizer, max_new_tokens=args.max_new_tokens)
        results = {}
        for name, one_at_a_time in (("batched", False), ("one-at-a-time", True)):
            results[name] = _measure(specs, pool, generator, chat, args.max_turns, one_at_a_time)
        pool.shutdown()

    print(f"model={args.model} trajectories={args.trajectories} max_turns={args.max_turns} "
          f"max_new_tokens={args.max_new_tokens} threads={torch.get_num_threads()}")
    print(f"{'loop':<15}{'seconds':>10}{'env steps':>11}{'steps/s':>10}{'tokens':>9}{'tokens/s':>10}")
    for name, (seconds, steps, tokens) in results.items():
        print(f"{name:<15}{seconds:>10.1f}{steps:>11}{steps / seconds:>10.2f}{tokens:>9}{tokens / seconds:>10.1f}")
    b, s = results["batched"], results["one-at-a-time"]
    print(f"speed-up (batched / one-at-a-time): env steps/s x{(b[1] / b[0]) / (s[1] / s[0]):.2f}, "
          f"tokens/s x{(b[2] / b[0]) / (s[2] / s[0]):.2f}")


if __name__ == "__main__":
    main()
