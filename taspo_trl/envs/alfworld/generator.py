"""Generate ALFWorld games (``game.tw-pddl`` files) for the six ALFWorld task families.

Every game is built from what the installed ``alfworld`` package ships: the PDDL domain
(``alfworld/data/alfred.pddl``), the text grammar (``alfred.twl2``), the per-FloorPlan receptacle and object
lists (``alfworld/gen/layouts/FloorPlanN-openable.json`` and ``-objects.json``), the placement and affordance
rules (``alfworld.gen.constants``) and the goal PDDL and task sentences per family
(``alfworld.gen.goal_library.gdict``). TextWorld's ``PddlEnv`` plays the result, and its Fast Downward
planner proves each problem solvable and provides the stored walkthrough; a problem the planner cannot solve
is reported and regenerated, never written.

Object names follow ALFWorld's mangled THOR ids (``Cabinet|+00.68|+00.50|-02.20`` is written
``Cabinet_bar__plus_00_dot_68_bar__plus_00_dot_50_bar__minus_02_dot_20``) so ALFWorld's ``AlfredDemangler``
shows them as "cabinet 1"; sink and bathtub basins keep THOR's ``Sink|x|y|z|SinkBasin`` shape, which the
demangler shows as "sinkbasin 1". Receptacles come from the FloorPlan's ``-openable.json`` keys; receptacle
types that the FloorPlan's object list names but ``-openable.json`` lacks (stove burners, toasters, ...) get
a synthesized THOR-style id that is stable per FloorPlan. Objects get synthesized ids near their receptacle.

Splits (a fixed partition, mirroring ALFRED's seen/unseen evaluation):

* Floorplans: ``eval_unseen`` uses ALFRED's held-out test scenes (``constants.TEST_SCENE_NUMBERS``: FloorPlans
  1-6, 201-206, 301-306, 401-406); ``train`` and ``eval_seen`` use the training scenes
  (``constants.TRAIN_SCENE_NUMBERS``: 7-30, 207-230, 307-330, 407-430).
* Target object types: ``eval_unseen`` targets only the types in :data:`UNSEEN_OBJECT_TYPES`; ``train`` and
  ``eval_seen`` never target them (they may still appear there as distractors).
* ``train`` and ``eval_seen`` share floorplans and types but draw instances from different random streams
  (the split name is part of every game's seed).

Generation is deterministic: the same ``(split, seed, per_type)`` writes byte-identical files, a different
seed gives different games.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from .engine import open_engine
from .tasks import (
    TASK_SHORT_NAMES,
    TASK_TYPES,
    _require_alfworld,
    add_task_to_grammar,
    describe_task,
)

SPLITS: tuple[str, ...] = ("train", "eval_seen", "eval_unseen")

UNSEEN_OBJECT_TYPES: frozenset[str] = frozenset(
    {"Potato", "Cup", "Lettuce", "Spatula", "SoapBar", "CellPhone", "KeyChain", "Pillow", "Pencil", "Vase"}
)
"""Target object types held out for ``eval_unseen``; chosen so every family stays possible on both sides
(e.g. Potato and Cup are heatable and coolable, SoapBar and Spatula cleanable, CellPhone and Pillow common in
bedrooms and living rooms)."""

GAME_FILE_NAME = "game.tw-pddl"

# The appliance each state-change family needs, and the receptacle type the domain's action checks for.
_APPLIANCE_BY_TASK = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
_AFFORDANCE_BY_TASK = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
_LAMP_TYPES = ("DeskLamp", "FloorLamp")
# Lamps are not placeable in THOR's rules, so they stand on a piece of furniture of one of these types.
_LAMP_HOST_TYPES = ("Desk", "SideTable", "Dresser", "Shelf", "DiningTable", "CoffeeTable", "TVStand")
# Receptacle types named by the domain's actions (CleanObject, HeatObject, ...): declared in every problem
# because the domain has no :constants section.
_DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
_DOMAIN_OTYPES = ("Knife", "ButterKnife")

_MIN_RECEPTACLES, _MAX_RECEPTACLES = 8, 16
_MIN_DISTRACTORS, _MAX_DISTRACTORS = 4, 9
_MAX_ATTEMPTS = 20


class GenerationError(RuntimeError):
    """No solvable game could be generated for a request (reported with the planner's reasons)."""


@dataclass(frozen=True)
class FloorPlan:
    """One AI2-THOR scene as ALFWorld's layout files describe it."""

    number: int
    room: str
    receptacles: tuple[str, ...]  # THOR ids, unmangled
    object_types: tuple[str, ...]  # pickupable object types present in the scene (targets and distractors)
    lamp_types: tuple[str, ...]


@dataclass(frozen=True)
class TaskChoice:
    """The what of one game: family, scene, target object type and its destination (or lamp)."""

    task_type: str
    floorplan: FloorPlan
    object_target: str
    parent_target: str  # receptacle type to put the object in; "" for Look
    toggle_target: str  # lamp type for Look; "" otherwise


@dataclass
class SolveReport:
    """The planner's verdict on one problem."""

    solvable: bool
    walkthrough: list[str]
    reason: str = ""


# --------------------------------------------------------------------------------------------------------
# What the installed alfworld package ships (imported lazily: alfworld is an optional dependency).


def _alfworld_root() -> Path:
    import alfworld

    return Path(alfworld.__file__).parent


@lru_cache(maxsize=1)
def game_logic() -> tuple[str, str]:
    """The installed ALFWorld's PDDL domain and text grammar (with the ``UNKNOWN GOAL`` task placeholder)."""
    _require_alfworld()
    data_dir = _alfworld_root() / "data"
    return (data_dir / "alfred.pddl").read_text(), (data_dir / "alfred.twl2").read_text()


def _receptacle_type(thor_id: str) -> str:
    # Basins keep the sink's id with the basin type appended: "Sink|x|y|z|SinkBasin".
    parts = thor_id.split("|")
    return parts[-1] if parts[-1].endswith("Basin") else parts[0]


def _coords(thor_id: str) -> tuple[float, float, float]:
    x, y, z = thor_id.split("|")[1:4]
    return float(x), float(y), float(z)


def _thor_id(type_name: str, x: float, y: float, z: float) -> str:
    return f"{type_name}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}"


@cache
def load_floorplan(number: int) -> FloorPlan:
    """Read one FloorPlan's receptacles and object types from ALFWorld's layout files."""
    constants, _ = _require_alfworld()
    layouts = _alfworld_root() / "gen" / "layouts"
    receptacles = sorted(json.loads((layouts / f"FloorPlan{number}-openable.json").read_text()))
    listed = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
    room = next(name for name, numbers in constants.SCENE_TYPE.items() if number in numbers)

    static_receptacle_types = constants.RECEPTACLES - constants.MOVABLE_RECEPTACLES_SET
    present_types = {_receptacle_type(r) for r in receptacles}
    xs, ys, zs = zip(*(_coords(r) for r in receptacles))
    stable_rng = random.Random(f"FloorPlan{number}")
    for type_name in sorted(set(listed) & static_receptacle_types - present_types):
        x, y, z = (round(stable_rng.uniform(min(c), max(c)), 2) for c in (xs, ys, zs))
        thor_id = _thor_id(type_name, x, y, z)
        if type_name.endswith("Basin"):
            thor_id = _thor_id(type_name[: -len("Basin")], x, y, z) + f"|{type_name}"
        receptacles.append(thor_id)

    placeable = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values())
    object_types = sorted(
        t for t in set(listed) if t in placeable and t in constants.OBJECTS and t not in static_receptacle_types
    )
    lamps = sorted(t for t in set(listed) if t in _LAMP_TYPES)
    return FloorPlan(number, room, tuple(sorted(receptacles)), tuple(object_types), tuple(lamps))


def split_floorplans(split: str) -> list[int]:
    """FloorPlan numbers a split draws from (see the module docstring for the partition)."""
    constants, _ = _require_alfworld()
    _check_split(split)
    numbers = constants.TEST_SCENE_NUMBERS if split == "eval_unseen" else constants.TRAIN_SCENE_NUMBERS
    return sorted(numbers)


def split_allows_target(split: str, object_type: str) -> bool:
    """Whether ``object_type`` may be the target object of a game in ``split``."""
    return (object_type in UNSEEN_OBJECT_TYPES) == (split == "eval_unseen")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; expected one of {', '.join(SPLITS)}.")


def _check_task_type(task_type: str) -> None:
    if task_type not in TASK_TYPES:
        raise ValueError(f"Unknown task type {task_type!r}; expected one of {', '.join(TASK_TYPES)}.")


# --------------------------------------------------------------------------------------------------------
# Choosing a task.


def _can_contain(receptacle_type: str, object_type: str) -> bool:
    constants, _ = _require_alfworld()
    return object_type in constants.VAL_RECEPTACLE_OBJECTS.get(receptacle_type, ())


def may_hold(receptacle: str, object_kind: str) -> bool:
    """Whether ALFWorld ever places an object of ``object_kind`` in ``receptacle``, by their in-game names
    (``"countertop 1"``, ``"apple"``): the prior a searching agent can learn, since every room follows it."""
    return _kind_of_name(receptacle) in _holders_by_kind().get(object_kind.lower(), frozenset())


def _kind_of_name(name: str) -> str:
    head, _, tail = name.strip().lower().rpartition(" ")
    return head if head and tail.isdigit() else name.strip().lower()


@cache
def _holders_by_kind() -> dict[str, frozenset[str]]:
    constants, _ = _require_alfworld()
    holders: dict[str, set[str]] = {}
    for receptacle_type, object_types in constants.VAL_RECEPTACLE_OBJECTS.items():
        for object_type in object_types:
            holders.setdefault(object_type.lower(), set()).add(receptacle_type.lower())
    return {kind: frozenset(types) for kind, types in holders.items()}


def _start_receptacle_types(task_type: str, floorplan: FloorPlan, object_type: str, parent: str) -> set[str]:
    """Receptacle types a target object may start in: never its destination, nor the appliance that changes
    its state (as ALFRED's task filters require)."""
    excluded = {parent, _APPLIANCE_BY_TASK.get(task_type, "")}
    return {
        _receptacle_type(r)
        for r in floorplan.receptacles
        if _can_contain(_receptacle_type(r), object_type) and _receptacle_type(r) not in excluded
    }


def task_choices(task_type: str, floorplan: FloorPlan, split: str) -> list[TaskChoice]:
    """Every (target object, destination or lamp) pair this family allows in this scene for this split."""
    constants, _ = _require_alfworld()
    if floorplan.room not in constants.GOALS_VALID[task_type]:
        return []
    receptacle_types = sorted({_receptacle_type(r) for r in floorplan.receptacles})
    appliance = _APPLIANCE_BY_TASK.get(task_type)
    if appliance and appliance not in receptacle_types:
        return []
    affordance = _AFFORDANCE_BY_TASK.get(task_type)
    choices = []
    for object_type in floorplan.object_types:
        if not split_allows_target(split, object_type):
            continue
        if affordance and object_type not in constants.VAL_ACTION_OBJECTS[affordance]:
            continue
        if task_type == "look_at_obj_in_light":
            if not any(t in _LAMP_HOST_TYPES for t in receptacle_types):
                continue
            if not _start_receptacle_types(task_type, floorplan, object_type, ""):
                continue
            choices += [TaskChoice(task_type, floorplan, object_type, "", lamp) for lamp in floorplan.lamp_types]
            continue
        for parent in receptacle_types:
            if parent == appliance or not _can_contain(parent, object_type):
                continue
            if _start_receptacle_types(task_type, floorplan, object_type, parent):
                choices.append(TaskChoice(task_type, floorplan, object_type, parent, ""))
    return choices


@cache
def _choices_per_floorplan(task_type: str, split: str) -> tuple[tuple[TaskChoice, ...], ...]:
    floorplans = [load_floorplan(n) for n in split_floorplans(split)]
    return tuple(tuple(c) for c in (task_choices(task_type, fp, split) for fp in floorplans) if c)


def _choose_task(task_type: str, split: str, rng: random.Random) -> TaskChoice:
    per_floorplan = _choices_per_floorplan(task_type, split)
    if not per_floorplan:
        raise GenerationError(f"No FloorPlan of split {split!r} allows task type {task_type!r}.")
    # Uniform over scenes first, so scenes with many receptacle types do not dominate.
    return rng.choice(rng.choice(per_floorplan))


# --------------------------------------------------------------------------------------------------------
# Laying out the scene.


@dataclass
class Scene:
    """Receptacles kept for the game and where each object starts (THOR ids, unmangled)."""

    receptacles: list[str]
    locations: dict[str, str]  # receptacle id -> location id
    start_location: str
    object_receptacle: dict[str, str]  # object id -> receptacle id
    object_types: dict[str, str]  # object id -> object type


def _free_location(x: float, z: float, rotation: int, horizon: int, used: set[str]) -> str:
    """A location id in ALFWorld's style (the agent's grid pose in 0.25 m steps, rotation, camera horizon),
    moved along x until no other receptacle stands there: one receptacle per location, so "go to X" names
    exactly one receptacle."""
    grid_x, grid_z = round(x * 4), round(z * 4)
    while (location := f"loc|{grid_x}|{grid_z}|{rotation}|{horizon}") in used:
        grid_x += 1
    used.add(location)
    return location


def _layout(choice: TaskChoice, rng: random.Random) -> Scene:
    fp = choice.floorplan
    by_type: dict[str, list[str]] = {}
    for receptacle in fp.receptacles:
        by_type.setdefault(_receptacle_type(receptacle), []).append(receptacle)

    # Required receptacles first: destination, appliance, the lamp's furniture, one place to start from.
    required: list[str] = []
    if choice.parent_target:
        required.append(rng.choice(by_type[choice.parent_target]))
    appliance = _APPLIANCE_BY_TASK.get(choice.task_type)
    if appliance:
        required.append(rng.choice(by_type[appliance]))
    lamp_host = None
    if choice.toggle_target:
        lamp_host = rng.choice([r for t in _LAMP_HOST_TYPES for r in by_type.get(t, [])])
        required.append(lamp_host)
    start_types = _start_receptacle_types(choice.task_type, fp, choice.object_target, choice.parent_target)
    start_candidates = [r for t in sorted(start_types) for r in by_type[t] if r != lamp_host]
    if not start_candidates:  # the only start type is the lamp's own furniture: share it
        start_candidates = [lamp_host]
    required.append(rng.choice(start_candidates))

    required = list(dict.fromkeys(required))
    others = [r for r in fp.receptacles if r not in required]
    wanted = rng.randint(_MIN_RECEPTACLES, _MAX_RECEPTACLES)
    receptacles = sorted(required + rng.sample(others, max(0, min(len(others), wanted - len(required)))))

    used: set[str] = set()
    locations: dict[str, str] = {}
    for receptacle in receptacles:
        x, _, z = _coords(receptacle)
        locations[receptacle] = _free_location(x, z, rng.choice((0, 90, 180, 270)), rng.choice((0, 30, 60)), used)
    start_location = _free_location(0.0, 0.0, 0, 30, used)

    object_receptacle: dict[str, str] = {}
    object_types: dict[str, str] = {}

    def place(object_type: str, allowed: list[str]) -> None:
        if not allowed:
            return
        receptacle = rng.choice(allowed)
        x, y, z = _coords(receptacle)
        object_id = _thor_id(
            object_type, x + rng.uniform(-0.3, 0.3), y + rng.uniform(0.0, 0.2), z + rng.uniform(-0.3, 0.3)
        )
        # Two objects on the same rounded coordinates are vanishingly rare; dropping one is harmless (a Pick2
        # game left short of copies fails the solvability check and is redrawn).
        if object_id in object_types:
            return
        object_receptacle[object_id] = receptacle
        object_types[object_id] = object_type

    kept_start = [r for r in receptacles if _receptacle_type(r) in start_types and r != lamp_host]
    if not kept_start:
        kept_start = [r for r in receptacles if r in start_candidates]
    copies = rng.randint(2, 3) if choice.task_type == "pick_two_obj_and_place" else rng.randint(1, 2)
    for _ in range(copies):
        place(choice.object_target, kept_start)
    if choice.toggle_target:
        place(choice.toggle_target, [lamp_host])

    distractor_types = [t for t in fp.object_types if t != choice.object_target]
    distractor_count = min(len(distractor_types), rng.randint(_MIN_DISTRACTORS, _MAX_DISTRACTORS))
    for object_type in rng.sample(distractor_types, distractor_count):
        place(object_type, [r for r in receptacles if _can_contain(_receptacle_type(r), object_type)])

    return Scene(receptacles, locations, start_location, object_receptacle, object_types)


# --------------------------------------------------------------------------------------------------------
# Writing the PDDL problem.


def mangle(thor_id: str) -> str:
    """ALFWorld's spelling of a THOR id as a PDDL name (``|`` -> ``_bar_``, ``-`` -> ``_minus_``, ...)."""
    for char, word in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        thor_id = thor_id.replace(char, word)
    return thor_id


def goal_pddl(choice: TaskChoice) -> str:
    """The family's goal from ALFWorld's goal library, closing the problem's ``(define`` as it does."""
    _, goal_library = _require_alfworld()
    template = goal_library.gdict[choice.task_type]["pddl"]
    filled = template.format(obj=choice.object_target, recep=choice.parent_target, toggle=choice.toggle_target)
    return filled.replace("#", "-")  # the library writes PDDL's type dash as '#'


def problem_pddl(choice: TaskChoice, scene: Scene, name: str) -> str:
    """The full PDDL problem for one game."""
    constants, _ = _require_alfworld()
    objects = sorted(scene.object_types)
    otypes = sorted(set(scene.object_types.values()) | set(_DOMAIN_OTYPES) | {choice.object_target})
    rtypes = sorted({_receptacle_type(r) for r in scene.receptacles} | set(_DOMAIN_RTYPES))
    present_rtypes = sorted({_receptacle_type(r) for r in scene.receptacles})
    present_otypes = sorted(set(scene.object_types.values()))

    declarations = ["agent1 - agent"]
    declarations += [f"{t}Type - otype" for t in otypes]
    declarations += [f"{t}Type - rtype" for t in rtypes]
    declarations += [f"{mangle(o)} - object" for o in objects]
    declarations += [f"{mangle(r)} - receptacle" for r in scene.receptacles]
    declarations += [f"{mangle(loc)} - location" for loc in sorted({*scene.locations.values(), scene.start_location})]

    facts = [f"(atLocation agent1 {mangle(scene.start_location)})"]
    for receptacle in scene.receptacles:
        rtype = _receptacle_type(receptacle)
        facts.append(f"(receptacleType {mangle(receptacle)} {rtype}Type)")
        facts.append(f"(receptacleAtLocation {mangle(receptacle)} {mangle(scene.locations[receptacle])})")
        if rtype in constants.OPENABLE_CLASS_SET:
            facts.append(f"(openable {mangle(receptacle)})")
    for rtype in present_rtypes:
        facts += [f"(canContain {rtype}Type {otype}Type)" for otype in present_otypes if _can_contain(rtype, otype)]
    affordances = (
        ("Cleanable", "cleanable"),
        ("Heatable", "heatable"),
        ("Coolable", "coolable"),
        ("Sliceable", "sliceable"),
        ("Toggleable", "toggleable"),
    )
    for obj in objects:
        otype, receptacle, pddl_name = scene.object_types[obj], scene.object_receptacle[obj], mangle(obj)
        facts.append(f"(objectType {pddl_name} {otype}Type)")
        if otype not in _LAMP_TYPES:
            facts.append(f"(pickupable {pddl_name})")
        if otype in constants.MOVABLE_RECEPTACLES_SET:
            facts.append(f"(isReceptacleObject {pddl_name})")
        facts += [
            f"({predicate} {pddl_name})" for key, predicate in affordances if otype in constants.VAL_ACTION_OBJECTS[key]
        ]
        facts.append(f"(inReceptacle {pddl_name} {mangle(receptacle)})")
        facts.append(f"(objectAtLocation {pddl_name} {mangle(scene.locations[receptacle])})")

    indent = "\n        "
    return (
        f"(define (problem {name})\n"
        f"    (:domain alfred)\n"
        f"    (:objects{indent}{indent.join(declarations)}\n    )\n"
        f"    (:init{indent}{indent.join(facts)}\n    )\n"
        f"{goal_pddl(choice)}"
    )


# --------------------------------------------------------------------------------------------------------
# Solvability.


def check_solvable(game: Mapping[str, Any]) -> SolveReport:
    """Ask Fast Downward for a plan, then replay it on the engine to confirm it wins.

    An unsolvable problem makes TextWorld's loader fail deep inside (``KeyError: 'val1'``, Fast Downward's
    placeholder atom for a goal it proved unreachable); it is reported here instead of raised.
    """
    try:
        engine = open_engine(game, with_plan=True)
        state = engine.reset()
    except KeyError as error:
        return SolveReport(False, [], f"Fast Downward proved the goal unreachable (KeyError {error}).")
    plan = list(state.get("policy_commands") or [])
    if not plan:
        return SolveReport(False, [], "the planner returned no plan")
    engine.request_infos.policy_commands = False  # replanning after every replayed step is wasted work
    won = False
    for command in plan:
        if command not in state["admissible_commands"]:
            return SolveReport(False, plan, f"planned command {command!r} is not admissible")
        state, _, won = engine.step(command)
    engine.close()
    if not won:
        return SolveReport(False, plan, "replaying the plan does not reach the goal")
    return SolveReport(True, plan)


# --------------------------------------------------------------------------------------------------------
# Games and files.


def _game_rng(split: str, seed: int, task_type: str, index: int, attempt: int) -> random.Random:
    # A string seed is hashed with SHA-512 by `random`, so the stream is stable across runs and platforms.
    return random.Random(f"taspo-alfworld|{split}|{seed}|{task_type}|{index}|{attempt}")


def generate_game(task_type: str, split: str, seed: int, index: int = 0) -> dict[str, Any]:
    """Build one solvable game as ``game.tw-pddl`` data (with ALFWorld's traj_data-like metadata).

    Unsolvable draws are regenerated from the next random stream; :class:`GenerationError` lists the
    planner's reasons when every attempt fails.
    """
    _check_task_type(task_type)
    _check_split(split)
    domain, grammar = game_logic()
    reasons = []
    for attempt in range(_MAX_ATTEMPTS):
        rng = _game_rng(split, seed, task_type, index, attempt)
        choice = _choose_task(task_type, split, rng)
        scene = _layout(choice, rng)
        pddl_params = {
            "object_target": choice.object_target,
            "parent_target": choice.parent_target,
            "toggle_target": choice.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        }
        task_description = describe_task(task_type, pddl_params, rng)
        game = {
            "pddl_domain": domain,
            "grammar": add_task_to_grammar(grammar, task_description),
            "pddl_problem": problem_pddl(choice, scene, f"taspo_{split}_{seed}_{TASK_SHORT_NAMES[task_type]}_{index}"),
            "solvable": None,
            "walkthrough": None,
            "task_type": task_type,
            "task_desc": task_description,
            "pddl_params": pddl_params,
            "scene": {"floor_plan": f"FloorPlan{choice.floorplan.number}", "scene_num": choice.floorplan.number},
            "split": split,
            "seed": seed,
            "index": index,
        }
        report = check_solvable(game)
        if report.solvable:
            game["solvable"], game["walkthrough"] = True, report.walkthrough
            return game
        reasons.append(f"attempt {attempt}: {report.reason}")
    raise GenerationError(
        f"No solvable {task_type} game for split={split} seed={seed} index={index} after {_MAX_ATTEMPTS} attempts: "
        + "; ".join(reasons)
    )


def game_directory_name(game: Mapping[str, Any]) -> str:
    """ALFWorld's directory naming: ``<task_type>-<Object>-<MovableRecep>-<Receptacle or Lamp>-<scene>``."""
    params = game["pddl_params"]
    destination = params["parent_target"] or params["toggle_target"]
    return f"{game['task_type']}-{params['object_target']}-None-{destination}-{game['scene']['scene_num']}"


def write_game(game: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write one game under ``out_dir/<split>/<task dir>/trial_s<seed>_<index>/game.tw-pddl``."""
    path = (
        Path(out_dir)
        / game["split"]
        / game_directory_name(game)
        / f"trial_s{game['seed']}_{game['index']:05d}"
        / GAME_FILE_NAME
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(game, sort_keys=True, indent=1) + "\n")
    return path


def generate_games(
    out_dir: str | Path,
    per_type: int,
    seed: int,
    split: str = "train",
    task_types: Iterable[str] | None = None,
    on_game: Callable[[Path, Mapping[str, Any]], None] | None = None,
) -> list[Path]:
    """Generate ``per_type`` solvable games of every family (or of ``task_types``) and write them.

    ``on_game(path, game)`` is called after each file is written (the CLI prints progress from it). Returns
    the written paths, family by family.
    """
    _check_split(split)
    if per_type < 0:
        raise ValueError(f"per_type must be >= 0, got {per_type}")
    families = list(task_types) if task_types is not None else list(TASK_TYPES)
    for task_type in families:
        _check_task_type(task_type)
    paths = []
    for task_type in families:
        for index in range(per_type):
            game = generate_game(task_type, split, seed, index)
            path = write_game(game, out_dir)
            paths.append(path)
            if on_game is not None:
                on_game(path, game)
    return paths


def find_game_files(root: str | Path) -> list[Path]:
    """All ``game.tw-pddl`` files under ``root`` (sorted), e.g. a generated split or ``$ALFWORLD_DATA``."""
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(root.rglob(GAME_FILE_NAME))
