"""``taspo-alfworld``: generate, list and replay embedded ALFWorld games.

taspo-alfworld generate --out DIR --per-type N --seed S [--split train|eval_seen|eval_unseen]
taspo-alfworld list DIR
taspo-alfworld play GAME_FILE
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _parse_task_types(text: str) -> list[str]:
    from .tasks import TASK_SHORT_NAMES, TASK_TYPES

    by_name = {**{t: t for t in TASK_TYPES}, **{s.lower(): t for t, s in TASK_SHORT_NAMES.items()}}
    chosen = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        task_type = by_name.get(name) or by_name.get(name.lower())
        if task_type is None:
            known = ", ".join(TASK_SHORT_NAMES.values())
            raise argparse.ArgumentTypeError(f"unknown task type {name!r} (use {known} or the full family names)")
        chosen.append(task_type)
    return chosen


def _generate(args: argparse.Namespace) -> int:
    from .generator import generate_games
    from .tasks import TASK_SHORT_NAMES, TASK_TYPES

    families = args.task_types or TASK_TYPES
    total = args.per_type * len(families)
    print(
        f"Generating {total} games ({args.per_type} per family) for split={args.split} seed={args.seed} in {args.out}"
    )
    started = time.perf_counter()
    done = 0

    def report(path: Path, game: Mapping[str, Any]) -> None:
        nonlocal done
        done += 1
        short = TASK_SHORT_NAMES[game["task_type"]]
        print(
            f"[{done}/{total}] {short:<5} {game['scene']['floor_plan']:<13} {game['task_desc']!r} "
            f"({len(game['walkthrough'])}-step walkthrough) -> {path}",
            flush=True,
        )

    paths = generate_games(args.out, args.per_type, args.seed, args.split, families, on_game=report)
    elapsed = time.perf_counter() - started
    per_game = f", {elapsed / len(paths):.2f} s per game" if paths else ""
    print(f"Done: {len(paths)} solvable games in {elapsed:.1f} s{per_game}, under {Path(args.out) / args.split}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from .env import ALFWorldEnv
    from .generator import find_game_files
    from .tasks import TASK_SHORT_NAMES

    files = find_game_files(args.dir)
    if not files:
        print(f"No game.tw-pddl files under {args.dir}.")
        return 1
    counts: Counter[str] = Counter()
    for path in files:
        env = ALFWorldEnv(path)
        short = TASK_SHORT_NAMES.get(env.task_type or "", "?")
        counts[short] += 1
        steps = len(env.walkthrough) if env.walkthrough else "-"
        print(f"{short:<5} {steps!s:>3}  {env.task:<50} {path}")
    summary = ", ".join(f"{name}: {counts[name]}" for name in [*TASK_SHORT_NAMES.values(), "?"] if counts[name])
    print(f"{len(files)} games ({summary})")
    return 0


def _play(args: argparse.Namespace) -> int:
    from .env import ALFWorldEnv

    env = ALFWorldEnv(args.game_file, max_turns=args.max_turns)
    if not env.walkthrough:
        print(f"{args.game_file} has no stored walkthrough to replay.")
        return 1
    print(env.reset())
    result = None
    for command in env.walkthrough:
        result = env.step(command)
        print(f"\n> {command}\n{result.observation}")
        if result.done:
            break
    env.close()
    won = bool(result and result.info["won"])
    print(f"\n{'WON' if won else 'NOT WON'} after {env.turns} steps (reward {result.reward if result else 0.0}).")
    return 0 if won else 1


def _build_parser() -> argparse.ArgumentParser:
    from .generator import SPLITS

    parser = argparse.ArgumentParser(prog="taspo-alfworld", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate solvable games for the six task families")
    generate.add_argument("--out", required=True, type=Path, help="output directory (a folder per split is made)")
    generate.add_argument("--per-type", required=True, type=int, help="games per task family")
    generate.add_argument("--seed", required=True, type=int)
    generate.add_argument("--split", default="train", choices=SPLITS)
    generate.add_argument(
        "--task-types",
        type=_parse_task_types,
        default=None,
        help="comma-separated families to generate (Pick,Look,Clean,Heat,Cool,Pick2); default: all six",
    )
    generate.set_defaults(run=_generate)

    listing = commands.add_parser("list", help="list the games under a directory")
    listing.add_argument("dir", type=Path)
    listing.set_defaults(run=_list)

    play = commands.add_parser("play", help="replay a game's stored walkthrough and print the transcript")
    play.add_argument("game_file", type=Path)
    play.add_argument("--max-turns", type=int, default=50)
    play.set_defaults(run=_play)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``taspo-alfworld`` console script."""
    from .generator import GenerationError

    args = _build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (FileNotFoundError, ValueError, ImportError, GenerationError) as error:
        print(f"taspo-alfworld: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
