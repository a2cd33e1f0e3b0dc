"""Check that an official benchmark environment is ready before a run uses it.

    python envs/check_setup.py alfworld [--data DIR]          # DIR: $ALFWORLD_DATA by default
    python envs/check_setup.py webshop --url http://127.0.0.1:3000
    python envs/check_setup.py search --url http://127.0.0.1:8000

Each check talks to the environment the way training does (an ALFWorld game reset on the real engine, a WebShop
episode opened through the adapter, one Search-R1 ``/retrieve`` request) and prints one line: ``ok: ...`` with
exit code 0, or what is wrong and how to fix it with exit code 1. ``--eval N`` then plays N tasks with
``taspo-eval`` on the embedded model, so a broken setup shows up before a long run does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SETUP_GUIDES = {name: f"envs/{name}/README.md" for name in ("alfworld", "webshop", "search")}


class SetupError(RuntimeError):
    """The environment is not ready; the message says what to do."""


def check_alfworld(data: str | None) -> str:
    """One game of ``data`` (a folder holding ``game.tw-pddl`` files) loads and resets on the TextWorld engine."""
    from taspo_trl.envs.alfworld.env import ALFWorldEnv
    from taspo_trl.envs.alfworld.generator import find_game_files

    if not data:
        raise SetupError("no ALFWorld data given: pass --data DIR or set $ALFWORLD_DATA "
                         f"(download it as {SETUP_GUIDES['alfworld']} shows)")
    root = Path(data).expanduser()
    if not root.exists():
        raise SetupError(f"{root} does not exist: download the data ({SETUP_GUIDES['alfworld']}) or fix the path")
    games = find_game_files(root)
    if not games:
        raise SetupError(f"{root} holds no game.tw-pddl file: point at the folder alfworld-download filled "
                         f"(it contains json_2.1.1/), see {SETUP_GUIDES['alfworld']}")
    env = ALFWorldEnv(games[0])
    try:
        observation = env.reset()
    finally:
        env.close()
    if not observation.strip():
        raise SetupError(f"{games[0]} reset to an empty observation: the file is damaged, download the data again")
    return f"{len(games)} ALFWorld games under {root}; {games[0].parent.name} resets on the engine"


def check_webshop(url: str) -> str:
    """Goal 0 of the WebShop site at ``url`` opens on a search page, through the adapter training uses."""
    from taspo_trl.envs.webshop.server import WebShopServerEnv

    try:
        env = WebShopServerEnv(url, goal_index=0, timeout=10.0)
    except ValueError as error:
        raise SetupError(str(error)) from None
    observation = env.reset()
    if observation.startswith("WebShop error"):
        reason = observation.removeprefix("WebShop error: ").removesuffix(" The episode has ended.").rstrip(".")
        raise SetupError(f"{reason}: start the site ({SETUP_GUIDES['webshop']})")
    if not env.admissible_commands or not env.admissible_commands[0].startswith("search["):
        raise SetupError(f"{url} answered, but not with WebShop's search page: is it the WebShop app?")
    return f"WebShop at {url} serves goal 0: {observation[:80]!r}"


def check_search(url: str) -> str:
    """One query to the Search-R1 retriever at ``url`` gets a well-formed ``/retrieve`` answer."""
    from taspo_trl.envs.search.retrieval import get_retriever

    try:
        retriever = get_retriever(url, timeout=10.0, retries=0)
        documents = retriever.retrieve(["health check"], topk=1)
    except (ValueError, OSError, RuntimeError) as error:
        raise SetupError(f"the retriever at {url} failed ({error}): start it ({SETUP_GUIDES['search']})") from None
    found = f"first document {documents[0][0].title!r}" if documents[0] else "no document for this query"
    return f"retriever at {url} answers /retrieve ({found})"


def run_eval(environment: str, location: str, tasks: int) -> None:
    """Play ``tasks`` tasks of ``environment`` with taspo-eval on the embedded model (few turns, short answers).

    ALFWorld plays ``valid_unseen`` of the official layout, or the given folder as one split."""
    if environment == "alfworld":
        official = Path(location) / "json_2.1.1" / "valid_unseen"
        split_dir = official if official.is_dir() else Path(location)
        where = ["--games_root", str(split_dir.parent), "--splits", split_dir.name]
    else:
        where = ["--webshop_url" if environment == "webshop" else "--retriever", location]
    command = [sys.executable, "-m", "taspo_trl.evaluation", "--environment", environment, *where,
               "--max_tasks", str(tasks), "--max_turns", "3", "--max_completion_length", "32",
               "--model_name_or_path", "embedded", "--results_dir", os.path.join("outputs", "check_setup")]
    print("running:", " ".join(command), flush=True)
    if subprocess.call(command) != 0:
        raise SetupError(f"taspo-eval failed on {environment}: its last lines above say why")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="environment", required=True)
    alfworld = commands.add_parser("alfworld", help="ALFWorld game files")
    alfworld.add_argument("--data", default=os.environ.get("ALFWORLD_DATA"), help="folder of game files ($ALFWORLD_DATA)")
    for name, default_port in (("webshop", 3000), ("search", 8000)):
        sub = commands.add_parser(name, help=f"the {name} server")
        sub.add_argument("--url", required=True, help=f"the server, e.g. http://127.0.0.1:{default_port}")
    for sub in commands.choices.values():
        sub.add_argument("--eval", type=int, default=0, metavar="N", help="then play N tasks with taspo-eval")
    args = parser.parse_args(argv)
    if args.eval < 0:
        parser.error(f"--eval must be 0 or more tasks, got {args.eval}")
    location = args.data if args.environment == "alfworld" else args.url
    try:
        if args.environment == "alfworld":
            print("ok:", check_alfworld(args.data))
        elif args.environment == "webshop":
            print("ok:", check_webshop(args.url))
        else:
            print("ok:", check_search(args.url))
        if args.eval:
            run_eval(args.environment, location, args.eval)
    except SetupError as error:
        print(f"{args.environment}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
