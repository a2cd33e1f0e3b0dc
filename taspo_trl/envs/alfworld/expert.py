"""The ALFWorld expert: the planner's walkthrough, one command per turn, with a short rationale for each.

The rationale is derived from the task and the state the command is played in (what the agent holds, where it
is, what the observation shows, what the next command needs), so it reads as the reasoning behind the command
rather than the command repeated. Several wordings per situation, chosen by a seeded RNG, keep the policy from
learning one fixed sentence; AlignOPSD embeds these thoughts as decision states.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

_TAKE = re.compile(r"^take (?P<obj>.+?) from (?P<recep>.+)$")
_MOVE = re.compile(r"^move (?P<obj>.+?) to (?P<recep>.+)$")
_TREAT = re.compile(r"^(?P<verb>clean|heat|cool) (?P<obj>.+?) with (?P<recep>.+)$")
_GO = re.compile(r"^go to (?P<recep>.+)$")
_OPEN = re.compile(r"^open (?P<recep>.+)$")
_USE = re.compile(r"^use (?P<lamp>.+)$")

_PARTICIPLE = {"clean": "cleaned", "heat": "heated", "cool": "cooled"}
_TREAT_WORDS = {
    "clean": ("wash it in the {recep}", "rinse it at the {recep}", "clean it with the {recep}"),
    "heat": ("warm it up in the {recep}", "heat it with the {recep}", "use the {recep} to heat it"),
    "cool": ("chill it in the {recep}", "cool it down with the {recep}", "use the {recep} to cool it"),
}


def _kind(name: str) -> str:
    """``"apple 1"`` -> ``"apple"``."""
    return name.rsplit(" ", 1)[0] if name.rsplit(" ", 1)[-1].isdigit() else name


def _next_purpose(plan: list[str], step: int) -> tuple[str, re.Match[str] | None]:
    """What the command after ``go to X`` does there: its verb and match (``("", None)`` at the end)."""
    if step + 1 >= len(plan):
        return "", None
    following = plan[step + 1]
    if following.startswith("open ") and step + 2 < len(plan):
        following = plan[step + 2]
    for verb, pattern in (("take", _TAKE), ("move", _MOVE), ("treat", _TREAT), ("use", _USE)):
        match = pattern.match(following)
        if match:
            return verb, match
    return "", None


def expert_thought(task: str, plan: list[str], step: int, holding: str | None, observation: str, rng: random.Random) -> str:
    """The rationale for playing ``plan[step]`` in the current state.

    Args:
        task: the task sentence ("put a clean knife in drawer.").
        plan: the whole walkthrough; later commands tell what a ``go to`` is for.
        step: the index of the command about to be played.
        holding: the object the agent carries (``None`` when its hands are empty).
        observation: what the game last said.
        rng: chooses among equivalent wordings.
    """
    goal = task.rstrip(". ")
    command = plan[step]
    pick = rng.choice
    if match := _GO.match(command):
        recep = match["recep"]
        purpose, target = _next_purpose(plan, step)
        if purpose == "take" and target is not None:
            obj = _kind(target["obj"])
            if holding is None and step > 0 and any(_MOVE.match(c) for c in plan[:step]):
                return pick((
                    f"One {obj} is in place, but the task needs another. The {recep} should have a second {obj}.",
                    f"I still need a second {obj}; I will look for it at the {recep}.",
                ))
            return pick((
                f"To {goal}, I first need a {obj}. The {recep} is a likely place to find one.",
                f"I have to find a {obj} before anything else. Let me check the {recep}.",
                f"My hands are empty and the task needs a {obj}; the {recep} may hold it.",
            ))
        if purpose == "treat" and target is not None:
            obj, verb = _kind(target["obj"]), target["verb"]
            return pick((
                f"The {obj} must be {_PARTICIPLE[verb]} before I place it, and the {recep} can do that.",
                f"Next the {obj} needs to be {_PARTICIPLE[verb]}. I will bring it to the {recep}.",
            ))
        if purpose == "move" and target is not None:
            obj = _kind(target["obj"])
            return pick((
                f"The {obj} is ready. It belongs in the {_kind(target['recep'])}, so I head to the {recep}.",
                f"Now I carry the {obj} to the {recep}, where the task wants it.",
                f"All that is left for this {obj} is to put it at the {recep}.",
            ))
        if purpose == "use" and target is not None:
            thing = _kind(holding) if holding else "object"
            return pick((
                f"To look at the {thing} in the light, I need a lamp. I will go to the {recep}.",
                f"I hold the {thing}; now I need light to examine it, so I go to the {recep}.",
            ))
        return pick((f"I will go to the {recep}.", f"The {recep} is where I need to be next."))
    if match := _OPEN.match(command):
        recep = match["recep"]
        closed = "closed" in observation
        return pick((
            f"The {recep} is {'closed' if closed else 'not open yet'}; I open it to see what is inside.",
            f"I cannot reach inside the {recep} until I open it.",
        ))
    if match := _TAKE.match(command):
        obj, recep = match["obj"], match["recep"]
        return pick((
            f"There is a {_kind(obj)} here on the {recep}. I pick up {obj}.",
            f"I see the {_kind(obj)} I need at the {recep}, so I take it.",
            f"{obj.capitalize()} is right here; taking it is the next part of the task.",
        ))
    if match := _TREAT.match(command):
        obj, recep, verb = match["obj"], match["recep"], match["verb"]
        how = pick(_TREAT_WORDS[verb]).format(recep=recep)
        return pick((
            f"I am at the {recep} with the {_kind(obj)}; I {how}.",
            f"The task needs a {_PARTICIPLE[verb]} {_kind(obj)}, so now I {how}.",
        ))
    if match := _MOVE.match(command):
        obj, recep = match["obj"], match["recep"]
        return pick((
            f"I am at the {recep} holding the {_kind(obj)}. Putting it here does what the task asks.",
            f"This is the {recep} the task means, so I place the {_kind(obj)} in it.",
        ))
    if match := _USE.match(command):
        lamp = match["lamp"]
        thing = _kind(holding) if holding else "object"
        return pick((
            f"The {lamp} is here and I hold the {thing}. Turning it on lets me look at the {thing} in its light.",
            f"I switch on the {lamp} to examine the {thing} under the light.",
        ))
    return f"The next step toward the goal is: {command}."


def held_after(command: str, holding: str | None) -> str | None:
    """What the agent carries after ``command`` succeeds."""
    if match := _TAKE.match(command):
        return match["obj"]
    if _MOVE.match(command):
        return None
    return holding


class ALFWorldExpert:
    """The expert of one episode: ``expert(observation, admissible, rng) -> (thought, command)``, called once per
    turn from reset on, with what the game showed before the turn."""

    def __init__(self, spec: Mapping[str, Any], env: Any) -> None:
        if not getattr(env, "walkthrough", None):
            raise ValueError(
                f"ALFWorld game {spec.get('game_file')} has no stored walkthrough, so it has no expert; generate "
                "games with `taspo-alfworld generate` (each generated game stores the planner's walkthrough)."
            )
        self.task = env.task
        self.plan: list[str] = list(env.walkthrough)
        self.step = 0
        self.holding: str | None = None

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]:
        if self.step > 0 and observation.strip() != "Nothing happens.":  # the game's answer to a failed command
            self.holding = held_after(self.plan[self.step - 1], self.holding)
        if self.step >= len(self.plan):
            raise ValueError(f"The walkthrough of {self.task!r} ended without a win.")
        thought = expert_thought(self.task, self.plan, self.step, self.holding, observation, rng)
        self.step += 1
        return thought, self.plan[self.step - 1]
