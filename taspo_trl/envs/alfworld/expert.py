"""The ALFWorld expert: it searches for the task's object the way a policy must, then finishes the task.

The planner's walkthrough knows where every object lies; a policy does not. An expert that walks straight to
the right receptacle teaches guesses that cannot generalise to unseen rooms, so this expert acts on what the
game shows instead:

- **fetch**: visit receptacles one by one (opening closed ones) until the wanted kind of object is in view, then
  take it. Before the walkthrough's source it may visit up to ``MAX_DETOURS`` other receptacles, drawn by the
  episode's RNG, so the demonstrations show what to do when the object is not there;
- **treat**: go to the sink, microwave or fridge the walkthrough uses and clean, heat or cool the object;
- **place**: go to the target receptacle, open it if closed, put the object in;
- **use**: go to the lamp the walkthrough uses and switch it on.

Every command is one the game lists as admissible, and the object is chosen from the game's own ``take``
commands, so the expert wins whichever instance it finds (ALFWorld goals name kinds, not instances). Each
command comes with a short rationale derived from the task and the state (what the agent holds, where it is,
what it just failed to find), in several wordings chosen by the RNG; AlignOPSD embeds these thoughts as decision
states.
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
_USE = re.compile(r"^use (?P<lamp>.+)$")

MAX_DETOURS = 2
"""Most receptacles the expert searches before the walkthrough's source of an object."""
DETOUR_WEIGHTS = (0.5, 0.3, 0.2)
"""Probability of 0, 1 and 2 detours per object fetched."""

_PARTICIPLE = {"clean": "cleaned", "heat": "heated", "cool": "cooled"}
_TREAT_WORDS = {
    "clean": ("wash it in the {recep}", "rinse it at the {recep}", "clean it with the {recep}"),
    "heat": ("warm it up in the {recep}", "heat it with the {recep}", "use the {recep} to heat it"),
    "cool": ("chill it in the {recep}", "cool it down with the {recep}", "use the {recep} to cool it"),
}


def _kind(name: str) -> str:
    """``"apple 1"`` -> ``"apple"``."""
    return name.rsplit(" ", 1)[0] if name.rsplit(" ", 1)[-1].isdigit() else name


class ALFWorldExpert:
    """The expert of one episode: ``expert(observation, admissible, rng) -> (thought, command)``, called once per
    turn from reset on, with what the game showed before the turn.

    The walkthrough gives the task's structure (what to fetch, how often, what to treat it with, where it goes);
    the commands come from the game's admissible list at each turn.
    """

    def __init__(self, spec: Mapping[str, Any], env: Any) -> None:
        if not getattr(env, "walkthrough", None):
            raise ValueError(
                f"ALFWorld game {spec.get('game_file')} has no stored walkthrough, so it has no expert; generate "
                "games with `taspo-alfworld generate` (each generated game stores the planner's walkthrough)."
            )
        self.goal = env.task.rstrip(". ")
        self.sources: list[str] = []  # the walkthrough's receptacle of each object it takes
        self.treat: tuple[str, str] | None = None  # (verb, receptacle)
        self.lamp: tuple[str, str] | None = None  # (lamp, the receptacle it stands on)
        self.target: str | None = None
        self.stages: list[str] = []
        place = None
        for command in env.walkthrough:
            if match := _GO.match(command):
                place = match["recep"]
            elif match := _TAKE.match(command):
                self.kind = _kind(match["obj"])
                self.sources.append(match["recep"])
                self.stages.append("fetch")
            elif match := _TREAT.match(command):
                self.treat = (match["verb"], match["recep"])
                self.stages.append("treat")
            elif match := _MOVE.match(command):
                self.target = match["recep"]
                self.stages.append("place")
            elif match := _USE.match(command):
                self.lamp = (match["lamp"], place or "")
                self.stages.append("use")
        if not self.sources or not (self.target or self.lamp):
            raise ValueError(f"Cannot read the task's structure from the walkthrough {env.walkthrough!r}.")
        self.stage = 0
        self.at: str | None = None
        self.holding: str | None = None
        self.placed = 0
        self.queue: list[str] | None = None  # receptacles still to search for the object being fetched
        self.missed: str | None = None  # the receptacle just searched in vain

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]:
        if self.stage >= len(self.stages):
            raise ValueError(f"The expert finished every stage of {self.goal!r} without a win.")
        commands = list(admissible or [])
        stage = self.stages[self.stage]
        if stage == "fetch":
            return self._fetch(commands, rng)
        if stage == "treat":
            verb, recep = self.treat  # type: ignore[misc]
            obj = _kind(self.holding or self.kind)
            if self.at != recep:
                return self._go(recep, rng.choice((
                    f"The {obj} must be {_PARTICIPLE[verb]} before I place it, and the {recep} can do that.",
                    f"Next the {obj} needs to be {_PARTICIPLE[verb]}. I will bring it to the {recep}.",
                )))
            self.stage += 1
            how = rng.choice(_TREAT_WORDS[verb]).format(recep=recep)
            return rng.choice((
                f"I am at the {recep} with the {obj}; I {how}.",
                f"The task needs a {_PARTICIPLE[verb]} {obj}, so now I {how}.",
            )), f"{verb} {self.holding} with {recep}"
        if stage == "place":
            return self._place(commands, rng)
        lamp, recep = self.lamp  # type: ignore[misc]
        thing = _kind(self.holding or self.kind)
        if self.at != recep:
            return self._go(recep, rng.choice((
                f"To look at the {thing} in the light, I need a lamp. I will go to the {recep}.",
                f"I hold the {thing}; now I need light to examine it, so I go to the {recep}.",
            )))
        self.stage += 1
        return rng.choice((
            f"The {lamp} is here and I hold the {thing}. Turning it on lets me look at the {thing} in its light.",
            f"I switch on the {lamp} to examine the {thing} under the light.",
        )), f"use {lamp}"

    def _go(self, recep: str, thought: str) -> tuple[str, str]:
        self.at = recep
        return thought, f"go to {recep}"

    def _fetch(self, commands: list[str], rng: random.Random) -> tuple[str, str]:
        obj = self.kind
        if self.queue is None:
            self.queue = self._search_order(commands, rng)
        elif self.at is not None and f"open {self.at}" in commands:
            return rng.choice((
                f"The {self.at} is closed; I open it to see whether a {obj} is inside.",
                f"I cannot see inside the {self.at} until I open it.",
            )), f"open {self.at}"
        elif takes := [m for c in commands if (m := _TAKE.match(c)) and m["recep"] == self.at and _kind(m["obj"]) == obj]:
            self.holding = takes[0]["obj"]
            self.stage += 1
            self.queue = None
            self.missed = None
            # Worded like the misses below up to the one word that differs ("a" / "no"), so that what decides
            # between taking and moving on is what the observation shows.
            return rng.choice((
                f"There is a {obj} at the {self.at}. I pick up {self.holding}.",
                f"The {self.at} has a {obj}; I take {self.holding}.",
                f"Here is a {obj} at the {self.at}, so I take it.",
            )), takes[0].group(0)
        else:
            self.missed = self.at
        self.queue = [r for r in self.queue if r != self.at and f"go to {r}" in commands]
        if not self.queue:
            raise ValueError(f"The expert searched every planned receptacle for a {obj} in vain ({self.goal!r}).")
        recep = self.queue.pop(0)
        if self.missed is not None:
            thought = rng.choice((
                f"There is no {obj} at the {self.missed}. I will try the {recep} next.",
                f"The {self.missed} has no {obj}; the {recep} might.",
                f"Here is no {obj} at the {self.missed}. Let me look for one at the {recep}.",
            ))
        elif self.placed:
            thought = rng.choice((
                f"One {obj} is in place, but the task needs another. The {recep} may have a second {obj}.",
                f"I still need a second {obj}; I will look for it at the {recep}.",
            ))
        else:
            thought = rng.choice((
                f"To {self.goal}, I first need a {obj}. The {recep} is a likely place to find one.",
                f"I have to find a {obj} before anything else. Let me check the {recep}.",
                f"My hands are empty and the task needs a {obj}; the {recep} may hold it.",
            ))
        return self._go(recep, thought)

    def _search_order(self, commands: list[str], rng: random.Random) -> list[str]:
        """Up to ``MAX_DETOURS`` other receptacles in random order, then the walkthrough's sources not yet used."""
        planned = self.sources[self.placed:] + self.sources[: self.placed]
        avoid = {*planned, self.target, self.at, self.treat and self.treat[1], self.lamp and self.lamp[1]}
        others = [m["recep"] for c in commands if (m := _GO.match(c)) and m["recep"] not in avoid]
        detours = rng.choices(range(MAX_DETOURS + 1), weights=DETOUR_WEIGHTS)[0]
        return rng.sample(others, min(detours, len(others))) + list(dict.fromkeys(planned))

    def _place(self, commands: list[str], rng: random.Random) -> tuple[str, str]:
        target, obj = self.target, _kind(self.holding or self.kind)
        if self.at != target:
            return self._go(target, rng.choice((  # type: ignore[arg-type]
                f"The {obj} is ready. It belongs in the {_kind(target)}, so I head to the {target}.",  # type: ignore[arg-type]
                f"Now I carry the {obj} to the {target}, where the task wants it.",
                f"All that is left for this {obj} is to put it at the {target}.",
            )))
        if f"open {target}" in commands:
            return rng.choice((
                f"The {target} is closed; I open it so that I can put the {obj} inside.",
                f"I have to open the {target} before the {obj} can go in.",
            )), f"open {target}"
        command = f"move {self.holding} to {target}"
        self.holding = None
        self.placed += 1
        self.stage += 1
        return rng.choice((
            f"I am at the {target} holding the {obj}. Putting it here does what the task asks.",
            f"This is the {target} the task means, so I place the {obj} in it.",
        )), command
