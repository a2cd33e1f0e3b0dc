"""A hand-built ALFWorld-like kitchen group ("put a clean apple in fridge"): its observations, the solving
steps (``SOLVE``), trajectory builders (``make_turn``, ``make_trajectory``), five siblings (``kitchen_group``),
and ``played``, a trajectory of a real environment playing a list of actions. Shared by the privileged-context,
fault and recipe tests."""

from __future__ import annotations

from taspo_trl.rollout.records import Trajectory, Turn

TASK = "put a clean apple in fridge."
INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a "
    "cabinet 1, a cabinet 2, a countertop 1, a countertop 2, a diningtable 1, a fridge 1, a garbagecan 1, a "
    "microwave 1, a sinkbasin 1, and a stoveburner 1.\n\nYour task is to: put a clean apple in fridge."
)
AT_COUNTERTOP = "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 1, and a knife 1."
TAKE = "You pick up the apple 1 from the countertop 1."
AT_SINK = "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."
CLEAN = "You clean the apple 1 using the sinkbasin 1."
AT_FRIDGE = "You arrive at fridge 1. The fridge 1 is closed."
OPEN_FRIDGE = "You open the fridge 1. The fridge 1 is open. In it, you see a egg 1, and a lettuce 1."
PUT = "You move the apple 1 to the fridge 1."
SOLVE = [
    ("go to countertop 1", AT_COUNTERTOP),
    ("take apple 1 from countertop 1", TAKE),
    ("go to sinkbasin 1", AT_SINK),
    ("clean apple 1 with sinkbasin 1", CLEAN),
    ("go to fridge 1", AT_FRIDGE),
    ("open fridge 1", OPEN_FRIDGE),
    ("move apple 1 to fridge 1", PUT),
]


def make_turn(action: str, observation: str, valid: bool = True) -> Turn:
    return Turn(
        prompt_ids=[],
        response_ids=[],
        logprobs=[],
        response_text=f"<think>next step</think><action>{action}</action>",
        action=action if valid else "",
        action_valid=valid,
        action_reason="" if valid else "no action block",
        action_span=(0, 0),
        observation=observation,
    )


def make_trajectory(
    steps: list[tuple[str, str]], won: bool, group: int = 0, task: str = TASK, intro: str = INTRO
) -> Trajectory:
    turns = [make_turn(action, observation) for action, observation in steps]
    if won:
        turns[-1].reward = 1.0
    return Trajectory(
        task_spec={"game_file": "kitchen.tw-pddl"},
        task=task,
        initial_observation=intro,
        group=group,
        env_name="alfworld",
        task_type="pick_clean_then_place_in_recep",
        turns=turns,
        reward=1.0 if won else 0.0,
        won=won,
    )


def kitchen_group(group: int = 0) -> list[Trajectory]:
    """Five siblings: three successes (one with a diningtable detour only it made), two failures (one that never
    found the apple, one that skipped cleaning)."""
    detour = [("go to diningtable 1", "You arrive at diningtable 1. On the diningtable 1, you see a mug 1.")] + SOLVE
    via_table = (
        SOLVE[:2]
        + [
            ("go to diningtable 1", "You arrive at diningtable 1. On the diningtable 1, you see a mug 1."),
            ("move apple 1 to diningtable 1", "You move the apple 1 to the diningtable 1."),
            ("take apple 1 from diningtable 1", "You pick up the apple 1 from the diningtable 1."),
        ]
        + SOLVE[2:]
    )
    lost = [
        ("go to countertop 2", "You arrive at countertop 2. On the countertop 2, you see a mug 2, and a spatula 1."),
        ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."),
        ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see a plate 1."),
        ("take plate 1 from cabinet 1", "You pick up the plate 1 from the cabinet 1."),
        ("go to fridge 1", AT_FRIDGE),
    ]
    unclean = SOLVE[:2] + SOLVE[4:]
    return [
        make_trajectory(SOLVE, won=True, group=group),
        make_trajectory(detour, won=True, group=group),
        make_trajectory(via_table, won=True, group=group),
        make_trajectory(lost, won=False, group=group),
        make_trajectory(unclean, won=False, group=group),
    ]


def played(env, actions: list[str]) -> Trajectory:
    """A trajectory of the real environment ``env`` playing ``actions`` (until the episode ends)."""
    intro, turns, result = env.reset(), [], None
    for action in actions:
        result = env.step(action)
        turns.append(make_turn(action, result.observation))
        if result.done:
            break
    return Trajectory(task_spec={}, task=env.task, initial_observation=intro, group=0, env_name=env.env_name,
                      turns=turns, reward=float(result.reward), won=bool(result.info["won"]))
