"""The task-selection arguments that ``taspo-train`` and ``taspo-eval`` share, and how both read ``--config``
and ``--env_module``."""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml


@dataclass
class AgentScriptArguments:
    """What to train on, beyond the trainer config (whose `environment` field names the benchmark).

    Parameters:
        method (`str`, defaults to `"grpo"`): credit method, one of `taspo_trl.trainers.method_names()` (the
            trainers' own and every name registered with `taspo_trl.credit.registry.register_credit`), or `sft` for a
            warm start on the environment's expert demonstrations (TRL's `SFTTrainer`).
        games_dir (`str`): ALFWorld game folder; generated there with the embedded generator when it holds no
            `.tw-pddl` file. Official games (`$ALFWORLD_DATA/json_2.1.1/train`) work the same way.
        games_per_type (`int`, defaults to `2`): generated games per task family when generating.
        games_seed (`int`, defaults to `0`): generator seed.
        games_split (`str`, defaults to `"train"`): generator split (`train`, `eval_seen`, `eval_unseen`).
        task_source (`str`, defaults to `"embedded"`): Search-QA: `embedded` or a folder of the official
            Search-R1 files; WebShop: `embedded`.
        task_split (`str`, defaults to `"train"`): Search-QA `train`/`test`; WebShop `train`/`eval`.
        search_datasets (`list[str]` or `None`): Search-QA question sets to use from `task_source` (`nq`,
            `hotpotqa`, ...; default: all found). Not TRL's dataset arguments: the rows are built from the
            environment's tasks. Called `datasets` before 0.2; that key is refused with a message naming this one.
        retriever (`str`, defaults to `"embedded"`): Search-QA retriever: `embedded` (bm25s over the shipped
            corpus) or the URL of a Search-R1-style retrieval server (`http://127.0.0.1:8000`).
        retrieval_topk (`int`, defaults to `3`): Search-QA documents per search.
        webshop_url (`str` or `None`): WebShop: URL of a running official WebShop server; `None` = embedded.
        max_tasks (`int` or `None`): use at most this many tasks (after sorting, for reproducibility).
        env_module (`str` or `None`): a module to import first, whose import registers your environments
            (`taspo_trl.envs.register_env`), e.g. `my_envs`; it must be importable (installed or on `PYTHONPATH`).
        env_kwargs (`dict` or `None`): settings merged into every task spec, so the environment factory receives
            them (a JSON object on the command line, a mapping in YAML): your environment's own keys, or a built-in
            one's (`{"max_turns": 20}`).
        reward_funcs (`list[str]` or `None`): reward functions added to the environment's verified reward, as in
            `trl grpo`: a name from `trl.rewards` (`think_format_reward`) or a dotted path `module.function`
            importable from the working directory; `taspo-train` only.
        overwrite_output_dir (`bool`, defaults to `False`): `taspo-train` refuses an `output_dir` that already
            holds `checkpoint-*` folders unless the run resumes (`--resume_from_checkpoint`) or this is set.
    """

    method: str = field(default="grpo", metadata={"help": "Credit method: one of taspo_trl.trainers.method_names(), or sft."})
    games_dir: str = field(default="outputs/alfworld_games/train", metadata={"help": "ALFWorld game folder."})
    games_per_type: int = field(default=2, metadata={"help": "Generated games per task family."})
    games_seed: int = field(default=0, metadata={"help": "Generator seed."})
    games_split: str = field(default="train", metadata={"help": "Generator split."})
    task_source: str = field(default="embedded", metadata={"help": "Search-QA/WebShop task source."})
    task_split: str = field(default="train", metadata={"help": "Search-QA/WebShop split."})
    search_datasets: list[str] | None = field(
        default=None, metadata={"help": "Search-QA question sets from task_source (nq, hotpotqa, ...; default all)."}
    )
    retriever: str = field(default="embedded", metadata={"help": "Search-QA retriever: embedded or a URL."})
    retrieval_topk: int = field(default=3, metadata={"help": "Search-QA documents per search."})
    webshop_url: str | None = field(default=None, metadata={"help": "Official WebShop server URL."})
    max_tasks: int | None = field(default=None, metadata={"help": "Use at most this many tasks."})
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Train into an output_dir that already holds checkpoints, replacing them."}
    )
    env_module: str | None = field(default=None, metadata={"help": "Module that registers your environments."})
    env_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Settings for every task's environment (a JSON object), merged into its task spec."}
    )
    reward_funcs: list[str] | None = field(
        default=None, metadata={"help": "Reward functions added to the environment's reward: TRL reward names or module.function."}
    )

    def __post_init__(self) -> None:
        self.env_kwargs = mapping_setting("env_kwargs", self.env_kwargs, '{"max_turns": 20}', "task settings")
        if self.env_kwargs and "prompt" in self.env_kwargs:
            raise ValueError("env_kwargs can't set 'prompt': it holds the task itself; name your setting otherwise")
        # A count below 1 would select no task at all (games_per_type 0 generates none) or, through a negative
        # slice, silently drop tasks from the end (max_tasks -1 keeps all but the last).
        for name in ("games_per_type", "max_tasks", "retrieval_topk"):
            value = getattr(self, name)
            if value is not None and value < 1:
                unset = " (or leave it unset for all tasks)" if name == "max_tasks" else ""
                raise ValueError(f"{name} must be >= 1, got {value}; set --{name} 1 or more{unset}")


def mapping_setting(name: str, value: Any, example: str, what: str) -> dict | None:
    """A mapping setting as given: a dict (YAML, Python), the JSON text of one (the command line), or ``None``;
    anything else fails in one line naming ``name`` and an ``example``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{name} must be a JSON object, e.g. '{example}': {error}") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{name} must be a mapping of {what}, got {value!r}")
    return value


def resolve_config_argv(argv: list[str], program: str) -> list[str]:
    """``argv`` with the value of ``--config`` made a file path: a file that exists is used as it is, anything
    else names a shipped recipe (``alfworld_taspo_cpu``, ``paper/search/taspo_lora``), so an installed wheel
    runs its recipes from any directory."""
    from .recipes import find_recipe

    if "--config" not in argv[:-1]:
        return argv
    at = argv.index("--config") + 1
    path = Path(argv[at])
    if not path.is_file():
        try:
            path = find_recipe(argv[at])
        except ValueError as error:
            raise SystemExit(f"{program}: --config {argv[at]}: no such file, and {error}.") from None
    _check_recipe_shape(path, program)
    return [*argv[:at], str(path), *argv[at + 1 :]]


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping names one key twice (plain YAML loading keeps the last silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, naming the key and both lines."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} appears twice (lines {seen[key]} and {line}); YAML would keep "
                                        "only the last, so remove the one you did not mean")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> Any:
    """``yaml.safe_load`` of the file at ``path``, refusing a key given twice in one mapping
    (``DuplicateKeyError``)."""
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader


def _check_recipe_shape(path: Path, program: str) -> None:
    try:
        data = load_yaml(path)
    except DuplicateKeyError as error:
        raise SystemExit(f"{program}: --config {path}: {error}.") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        problem = " ".join(str(error).split())
        raise SystemExit(f"{program}: --config {path}: not valid YAML ({problem}).") from None
    if not isinstance(data, dict):
        raise SystemExit(
            f"{program}: --config {path}: a recipe is a YAML mapping of settings (`key: value` lines), "
            f"not a {type(data).__name__}."
        )


# Settings that were renamed: the old name is refused with the new one (no silent alias, which would let a recipe
# written for TRL, where `datasets` means something else, pass unread).
RENAMED_SETTINGS = {
    "datasets": "search_datasets",  # Search-QA's question sets, not TRL's dataset arguments
}


def _renamed(name: str, where: str, prefix: str = "") -> ValueError:
    new = RENAMED_SETTINGS[name]
    return ValueError(f"{where}: the setting {prefix}{name} is now called {prefix}{new} (the same values); rename it")


def check_setting_names(parser: Any, argv: list[str], check_recipe: bool = True) -> None:
    """Refuse a ``--flag`` (and, with ``check_recipe``, a key of the ``--config`` recipe) that names no field of
    ``parser``'s dataclasses, suggesting the closest real one: TRL's own message lists the unknown names and
    suggests nothing. Only whole names pass: ``--max_step 1`` is refused (did you mean --max_steps?) rather than
    taken as an abbreviation, as argparse would (the parsers are built with ``allow_abbrev=False`` too).

    Raises:
        ValueError: naming the unknown setting, where it came from, and the closest field.
    """
    fields = sorted({action.dest for action in parser._actions} - {"help"})
    flags = [option for action in parser._actions for option in action.option_strings]
    if check_recipe and "--config" in argv[:-1]:
        path = argv[argv.index("--config") + 1]
        recipe = load_yaml(path) or {}
        for key in recipe:
            if key in RENAMED_SETTINGS and key not in fields:
                raise _renamed(key, f"--config {path}")
            if key != "env" and key not in fields:  # `env:` is TRL's block of environment variables
                raise ValueError(f"--config {path}: unknown setting {key!r}{_closest(str(key), fields)}")
    for token in argv:
        flag = token.split("=", 1)[0]
        if not flag.startswith("--") or flag == "--config" or flag in flags:
            continue
        if flag[2:] in RENAMED_SETTINGS:
            raise _renamed(flag[2:], "command line", prefix="--")
        raise ValueError(f"unknown flag {flag}{_closest(flag[2:], fields, prefix='--')}")


def _closest(name: str, fields: list[str], prefix: str = "") -> str:
    match = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    return f"; did you mean {prefix}{match[0]}?" if match else " (--help lists the settings)"


def one_line_errors(program: str, argv: list[str]) -> tuple[list[str], Callable[[BaseException], NoReturn]]:
    """``argv`` without ``--debug``, and the handler that turns a setup error (bad input found before any work)
    into one line naming it; with ``--debug`` it re-raises, keeping the traceback."""
    debug = "--debug" in argv

    def fail(error: BaseException) -> NoReturn:
        if debug:
            raise error
        message = " ".join(str(error).split()) or type(error).__name__
        raise SystemExit(f"{program}: error: {message} (--debug shows the traceback)") from None

    return [a for a in argv if a != "--debug"], fail


SETUP_ERRORS = (ValueError, OSError, ImportError, KeyError)
"""What a setup step raises on bad input; `one_line_errors` reports these in one line."""


def with_env_kwargs(rows: list[dict[str, Any]], env_kwargs: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``rows`` with ``env_kwargs`` as columns of each, which ``task_spec_from_row`` merges over its task spec."""
    return [{**row, **env_kwargs} for row in rows] if env_kwargs else rows


def resolve_reward_funcs(names: list[str] | None) -> list[Callable[..., Any]]:
    """The reward functions ``--reward_funcs`` names, as ``trl grpo`` finds them: a function of ``trl.rewards`` by
    name, or ``module.function`` imported from the working directory or the installed packages."""
    functions = []
    for name in names or []:
        module_name, _, attribute = name.rpartition(".")
        if not module_name:
            import trl.rewards

            if not callable(getattr(trl.rewards, name, None)):
                known = sorted(n for n in dir(trl.rewards) if n.endswith("_reward"))
                raise ValueError(f"reward function {name!r} is not in trl.rewards ({', '.join(known)}); give "
                                 "module.function for your own")
            functions.append(getattr(trl.rewards, name))
            continue
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # as `trl grpo`: a reward module beside the recipe imports
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"reward function {name!r}: {error}; the module must be importable (installed, or in "
                             "the working directory) and define the function") from None
        if not callable(function):
            raise ValueError(f"reward function {name!r} is not callable")
        functions.append(function)
    return functions


def import_env_module(name: str | None, program: str) -> None:
    """Import ``--env_module``: registration happens in the process that trains, and ``taspo-train`` and
    ``taspo-eval`` are console scripts, so a user's environments are registered by importing their module."""
    if not name:
        return
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise SystemExit(
            f"{program}: --env_module {name}: {error}; the module must be importable (installed, or its folder "
            "on PYTHONPATH)."
        ) from None
