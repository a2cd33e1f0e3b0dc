"""Hand-made ALFWorld games for the engine tests: a tiny kitchen problem in ALFWorld's PDDL style and a writer of
game files (``.tw-pddl`` JSON) from their parts."""

from __future__ import annotations

import json
from pathlib import Path


def tiny_kitchen_problem() -> str:
    """A hand-written problem in ALFWorld's style: an apple on a countertop, a closed fridge."""
    apple = "Apple_bar__plus_00_dot_10_bar__plus_00_dot_95_bar__minus_01_dot_00"
    counter = "CounterTop_bar__plus_00_dot_20_bar__plus_00_dot_90_bar__minus_01_dot_10"
    fridge = "Fridge_bar__minus_02_dot_10_bar__plus_00_dot_00_bar__plus_01_dot_09"
    return f"""
(define (problem tiny_kitchen)
    (:domain alfred)
    (:objects
        agent1 - agent
        AppleType KnifeType ButterKnifeType - otype
        CounterTopType FridgeType MicrowaveType SinkBasinType - rtype
        {apple} - object
        {counter} {fridge} - receptacle
        loc_bar_0_bar_0_bar_0_bar_30 loc_bar_1_bar__minus_4_bar_180_bar_30 loc_bar__minus_8_bar_4_bar_270_bar_0 - location
    )
    (:init
        (atLocation agent1 loc_bar_0_bar_0_bar_0_bar_30)
        (receptacleType {counter} CounterTopType)
        (receptacleType {fridge} FridgeType)
        (receptacleAtLocation {counter} loc_bar_1_bar__minus_4_bar_180_bar_30)
        (receptacleAtLocation {fridge} loc_bar__minus_8_bar_4_bar_270_bar_0)
        (openable {fridge})
        (canContain CounterTopType AppleType)
        (canContain FridgeType AppleType)
        (objectType {apple} AppleType)
        (pickupable {apple})
        (inReceptacle {apple} {counter})
        (objectAtLocation {apple} loc_bar_1_bar__minus_4_bar_180_bar_30)
    )
    (:goal
        (exists (?o - object ?r - receptacle)
            (and (objectType ?o AppleType) (receptacleType ?r FridgeType) (inReceptacle ?o ?r))))
)
"""


def write_game(path: Path, **game) -> Path:
    """Writes a game file (``pddl_domain``, ``grammar``, ``pddl_problem``, ... as given) as JSON at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(game))
    return path
