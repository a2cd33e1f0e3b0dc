"""The TextWorld/ALFWorld engine that plays a ``game.tw-pddl`` problem, kept from leaking into the process.

TextWorld's ``PddlEnv`` runs the PDDL problem and ALFWorld's ``AlfredDemangler`` names things as ALFWorld prints
them ("apple 1", "sinkbasin 1"). ``alfworld`` and ``textworld`` are optional dependencies, imported on first use.
``sys.argv`` is put back after every engine call (Fast Downward's translator sets it to
``['translate.py', 'domain', 'task']``).

Fast Downward keeps its search state in globals, so TextWorld gives every ``PddlEnv`` its own copy of the 33 MB
``libdownward.so``, copied to a temporary folder and loaded there; the folder is deleted but the library stays
mapped (its disk space held) until the process ends. One copy per game filled the disk of a warm-start build
(thousands of episodes in one process). A closed engine's copy is kept here and handed to the next engine, so a
process holds as many copies as it ever had engines open at once.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Mapping
from typing import Any

_INSTALL_HINT = 'pip install "taspo-trl[alfworld]"'


def _require_engine():
    """TextWorld's PDDL environment and ALFWorld's demangler, or a clear ImportError."""
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs import PddlEnv
    except ImportError as error:
        raise ImportError(
            f"ALFWorld environments need the `alfworld` and `textworld[pddl]` packages: {_INSTALL_HINT}"
        ) from error
    _remember_template_parses()
    return textworld.EnvInfos, PddlEnv, AlfredDemangler


def _remember_template_parses() -> None:
    """Make TextWorld parse each of its text templates and logic expressions once per process.

    TextWorld re-parses, with a TatSu grammar, every template it renders (each admissible command, each
    feedback sentence) and every rule condition it checks, at every step, and the whole domain at every load:
    about two thirds of an ALFWorld step's time (``benchmarks/alfworld_engine.py``). A parse depends only on its
    text and arguments, so the first result is kept and each call gets a deep copy of it (TextWorld mutates the
    symbols it gets). Nothing it produces changes. Environments stepped from several threads may race to parse
    the same text first; that only parses it twice.
    """
    for module in _parsing_modules():
        parse = getattr(module, "_parse_and_convert", None)
        if parse is not None and not hasattr(parse, "remembered"):
            module._parse_and_convert = _remembering(parse)


def _parsing_modules() -> tuple[Any, ...]:
    """TextWorld's modules whose ``_parse_and_convert`` is remembered: text generation, logic, PDDL logic."""
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic

    return textgen, logic, pddl_logic


def _remembering(parse: Any) -> Any:
    parsed: dict[tuple, Any] = {}

    def remembered_parse(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = parse(*args, **kwargs)
        return copy.deepcopy(parsed[key])

    remembered_parse.remembered = True
    remembered_parse.__wrapped__ = parse
    return remembered_parse


class _ArgvKeeper:
    """A context that puts back ``sys.argv`` (the very list object) once the engine code inside it is done.

    Fast Downward's translator rebinds ``sys.argv`` for its option parser, and code that reads arguments
    after an environment exists (a user's script, argparse) would see those. Calls from several threads
    overlap safely: the list is put back when the last of them ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._argv: list[str] = []

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._argv = sys.argv
            self._inside += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                sys.argv = self._argv


_KEEP_ARGV = _ArgvKeeper()

_IDLE_DOWNWARD_LIBS: list[Any] = []  # Fast Downward copies whose engines closed; each loads its next game afresh
_IDLE_LOCK = threading.Lock()


def _pddl_env(pddl_env_class: type, infos: Any) -> Any:
    """A ``PddlEnv`` on an idle Fast Downward copy when one is free, else on a fresh copy (``PddlEnv`` loads one)."""
    with _IDLE_LOCK:
        downward_lib = _IDLE_DOWNWARD_LIBS.pop() if _IDLE_DOWNWARD_LIBS else None
    if downward_lib is None:
        return pddl_env_class(infos)
    pddl_env = pddl_env_class.__new__(pddl_env_class)
    super(pddl_env_class, pddl_env).__init__(infos)  # what PddlEnv.__init__ does besides loading its copy
    pddl_env.downward_lib = downward_lib
    return pddl_env


class _Engine:
    """TextWorld's environment, with ``sys.argv`` kept around every call; other attributes pass through."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._closed = False

    def reset(self) -> Any:
        with _KEEP_ARGV:
            return self._engine.reset()

    def step(self, command: str) -> Any:
        with _KEEP_ARGV:
            return self._engine.step(command)

    def close(self) -> None:
        with _KEEP_ARGV:
            self._engine.close()
        downward_lib = getattr(self._engine, "downward_lib", None)  # the demangler passes it through
        if downward_lib is not None and not self._closed:
            with _IDLE_LOCK:
                _IDLE_DOWNWARD_LIBS.append(downward_lib)
        self._closed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def open_engine(game: Mapping[str, Any], with_plan: bool = False) -> Any:
    """Load game data (a ``.tw-pddl`` dict) into a demangled ``PddlEnv``; ``with_plan`` also asks Fast
    Downward for ``policy_commands``. Raises ``KeyError`` from deep inside TextWorld for unsolvable problems."""
    EnvInfos, PddlEnv, AlfredDemangler = _require_engine()
    infos = EnvInfos(admissible_commands=True, won=True, policy_commands=with_plan)
    with _KEEP_ARGV:
        try:
            pddl_env = _pddl_env(PddlEnv, infos)
        except ImportError as error:  # textworld installed without its [pddl] extra (Fast Downward)
            raise ImportError(
                f"ALFWorld environments need Fast Downward from `textworld[pddl]`: {_INSTALL_HINT}"
            ) from error
        engine = AlfredDemangler(pddl_env, shuffle=False)
        engine.load(dict(game))
    # The demangler names an object without a numeric suffix "desk " (name, space, empty number), so its
    # commands would read "go to desk " and PddlEnv, which strips the command it is given, would match none.
    for info in engine._entity_infos.values():
        if isinstance(info.name, str):
            info.name = info.name.strip()
    return _Engine(engine)
