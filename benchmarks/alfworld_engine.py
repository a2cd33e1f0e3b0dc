"""ALFWorld engine speed: TextWorld as shipped against TextWorld with its template parses remembered.

``taspo_trl.envs.alfworld.engine`` makes TextWorld parse each text template and logic expression once per
process instead of at every step and load. This plays the same episodes both ways in one run (fresh
environments loaded from the generated quickstart games, then seeded random admissible commands) and reports
loads+resets/s, steps/s and the ratios. It also checks that both ways print exactly the same observations and
admissible commands, since the shortcut must not change what the game says:

    python benchmarks/alfworld_engine.py --episodes 12 --steps 15
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from unittest import mock

from taspo_trl.envs.alfworld import alfworld_env_factory, engine, generate_games


def _play(games: list[str], episodes: int, steps: int) -> tuple[float, float, int, list[str]]:
    """Seconds spent loading+resetting, seconds spent stepping, steps taken, and everything the games printed."""
    rng = random.Random(0)
    reset_seconds = step_seconds = 0.0
    taken = 0
    transcript = []
    for episode in range(episodes):
        env = alfworld_env_factory({"game_file": games[episode % len(games)], "max_turns": steps})
        started = time.perf_counter()
        transcript.append(env.reset())
        reset_seconds += time.perf_counter() - started
        transcript.append("|".join(env.admissible_commands))
        for _ in range(steps):
            command = rng.choice(env.admissible_commands)
            started = time.perf_counter()
            result = env.step(command)
            step_seconds += time.perf_counter() - started
            taken += 1
            transcript += [command, result.observation, "|".join(env.admissible_commands)]
            if result.done:
                break
        env.close()
    return reset_seconds, step_seconds, taken, transcript


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--steps", type=int, default=15, help="random admissible commands per episode")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as games_dir:
        games = [str(path) for path in sorted(generate_games(games_dir, per_type=1, seed=0, split="train"))]
        for module in engine._parsing_modules():  # generate_games went through the engine: undo its shortcut
            module._parse_and_convert = getattr(module._parse_and_convert, "__wrapped__", module._parse_and_convert)
        with mock.patch.object(engine, "_remember_template_parses", lambda: None):
            plain = _play(games, args.episodes, args.steps)
        remembered = _play(games, args.episodes, args.steps)

    if plain[3] != remembered[3]:
        raise SystemExit("the two ways printed different games: the remembered parses changed what TextWorld says")
    steps = remembered[2]
    print(f"{args.episodes} episodes, {steps} steps, identical transcripts: yes")
    print(f"{'TextWorld':<22}{'loads+resets/s':>16}{'steps/s':>10}")
    for name, (reset_s, step_s, _, _) in (("as shipped", plain), ("parses remembered", remembered)):
        print(f"{name:<22}{args.episodes / reset_s:>16.2f}{steps / step_s:>10.2f}")
    print(f"{'ratio':<22}{plain[0] / remembered[0]:>15.2f}x{plain[1] / remembered[1]:>9.2f}x")


if __name__ == "__main__":
    main()
