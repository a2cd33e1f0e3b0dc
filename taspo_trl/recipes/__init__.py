"""The shipped recipes and accelerate configs, found by name; ``taspo-recipes`` lists, shows and copies them.

    taspo-recipes list                        # every recipe: its name and what it runs
    taspo-recipes show alfworld_taspo_cpu     # print one
    taspo-recipes copy alfworld_taspo_cpu .   # write ./alfworld_taspo_cpu.yaml to edit and run
    taspo-recipes path zero3                  # its file, e.g. for accelerate launch --config_file

A recipe's full name is its path in this folder without ``.yaml`` (``quickstart/alfworld_taspo_cpu``,
``paper/search/taspo_lora``, ``accelerate/zero3``); its file name alone (``alfworld_taspo_cpu``) names it too
when no other recipe has that file name. ``taspo-train --config NAME`` and ``taspo-eval --config NAME`` accept
the same names. The YAML files are written by ``generate.py`` here (the accelerate configs by hand).
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
from pathlib import Path

RECIPES_DIR = Path(__file__).resolve().parent


def recipe_files() -> dict[str, Path]:
    """Every shipped recipe and accelerate config, by full name."""
    return {path.relative_to(RECIPES_DIR).with_suffix("").as_posix(): path for path in sorted(RECIPES_DIR.rglob("*.yaml"))}


def short_name(full_name: str, full_names: list[str]) -> str:
    """The file name alone when no other of ``full_names`` ends in it, else the full name."""
    stem = full_name.rsplit("/", 1)[-1]
    return stem if sum(name.rsplit("/", 1)[-1] == stem for name in full_names) == 1 else full_name


def find_recipe(name: str) -> Path:
    """The file of the shipped recipe ``name``: a full name, a unique file name, either with ``.yaml``, or a
    checkout path (``recipes/quickstart/alfworld_taspo_cpu.yaml``). Raises ``ValueError`` naming the close
    names when there is no such recipe, and the candidates when a file name is ambiguous."""
    files = recipe_files()
    key = name.removeprefix("recipes/").removesuffix(".yaml")
    if key in files:
        return files[key]
    same_stem = [full for full in files if full.rsplit("/", 1)[-1] == key]
    if len(same_stem) == 1:
        return files[same_stem[0]]
    if same_stem:
        raise ValueError(f"{name!r} names {len(same_stem)} recipes, choose one: {', '.join(same_stem)}")
    known = sorted({short_name(full, list(files)) for full in files} | set(files))
    close = difflib.get_close_matches(key, known, n=5, cutoff=0.6)
    hint = f"; close names: {', '.join(close)}" if close else ""
    raise ValueError(f"there is no shipped recipe named {name!r}{hint} (taspo-recipes list shows them all)")


def describe(path: Path) -> str:
    """The first sentence of a recipe's header comment: what it runs."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    text = " ".join(header)
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def copy_recipe(name: str, directory: str | Path) -> Path:
    """Copy recipe ``name`` into ``directory`` (created if missing) under its file name; an existing file is
    not overwritten."""
    source = find_recipe(name)
    target = Path(directory) / source.name
    if target.exists():
        raise FileExistsError(f"{target} exists; remove it or copy into another directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``taspo-recipes``: list, show, copy or locate the shipped recipes."""
    parser = argparse.ArgumentParser(
        prog="taspo-recipes", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every recipe: its name and what it runs")
    for command, help_text in (("show", "print a recipe"), ("path", "print a recipe's file path")):
        commands.add_parser(command, help=help_text).add_argument("name")
    copy = commands.add_parser("copy", help="copy a recipe into a directory, to edit and run")
    copy.add_argument("name")
    copy.add_argument("directory")
    args = parser.parse_args(argv)

    if args.command == "list":
        files = recipe_files()
        names = {full: short_name(full, list(files)) for full in files}
        width = max(map(len, names.values()))
        for full, path in files.items():
            print(f"{names[full]:<{width}}  {describe(path)}")
        return 0
    try:
        path = find_recipe(args.name)
        target = copy_recipe(args.name, args.directory) if args.command == "copy" else None
    except (ValueError, FileExistsError) as error:
        print(f"taspo-recipes: {error}", file=sys.stderr)
        return 2
    if target is not None:
        run = (f"accelerate launch --config_file {target} -m taspo_trl.cli --config RECIPE"
               if path.parent.name == "accelerate" else f"taspo-train --config {target}")
        print(f"wrote {target}; run it with: {run}")
    elif args.command == "show":
        print(path.read_text(), end="")
    else:
        print(path)
    return 0
