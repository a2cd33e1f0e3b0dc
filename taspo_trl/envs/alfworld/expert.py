"""The ALFWorld expert: it searches for the task's object the way a policy must, then finishes the task.

The planner's walkthrough knows where every object lies; a policy does not. An expert that walks straight to
the right receptacle teaches guesses that cannot generalise to unseen rooms, so this expert acts on what the
game shows instead:

- **fetch**: visit receptacles one by one (opening closed ones) until the wanted kind of object is in view, then
  take it. Before the walkthrough's source it may visit up to ``MAX_DETOURS`` other receptacles, drawn by the
  episode's RNG, so the demonstrations show what to do when the object is not there. An ``informed`` expert
  makes no detour: it acts as an agent told where things are (TASPO's privileged context names the places);
- **treat**: go to the sink, microwave or fridge the walkthrough uses and clean, heat or cool the object;
- **place**: go to the target receptacle, open it if closed, put the object in;
- **use**: go to the lamp the walkthrough uses and switch it on.

Every command is one the game lists as admissible, and the object is chosen from the game's own ``take``
commands, so the expert wins whichever instance it finds (ALFWorld goals name kinds, not instances). Each
command comes with a short rationale derived from the task and the state (what the agent holds, where it is,
what it just failed to find), in several wordings chosen by the RNG; AlignOPSD embeds these thoughts as decision
states. Every wording of one stage opens with the same word ("Looking", "Is", "Closed", "Next", "Holding",
"Another", "Light", "Wrong"), and no two stages share it: a small policy commits to a stage with its first thought
token and then writes the matching command, so an opening shared between stages ("I am at ...") let it drift into
the wrong one.

Whether the agent stands where the stage needs it (at a place with the wanted object, at the sink, microwave or
fridge, at the target, at the lamp) is asked as a question with that name in it, then answered: "Is a cd here?
Yes, so I take cd 1.", "Holding the cd, is the garbagecan here? No, so I head to the garbagecan 1." The deciding
word then comes right after the name it depends on, as a yes/no answer. Opening with the outcome instead ("Found a
cd ..." / "No cd ...", "Holding ..." / "Here is the garbagecan ...") made the 135M policy answer whether anything
at all was in view, not whether the wanted kind was (``benchmarks/arrival_judgement.py``), and put objects down
where it had just picked them up.

A thought never names the place a search goes next or where the lamp stands: the command alone picks it. TASPO
measures the privileged context's effect on the action's tokens only (Eq. 3), so a decision the thought already
made reaches the action as a copy, certain with or without the context, and the policy's credit weights come
out flat (``taspo/weight_std`` near 0 on the 240-game warm start whose thoughts named the place). The places the
task names (the target, the sink, microwave or fridge) stay in the thoughts: no context changes them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from ..base import normalize_command
from .generator import may_hold

_TAKE = re.compile(r"^take (?P<obj>.+?) from (?P<recep>.+)$")
_MOVE = re.compile(r"^move (?P<obj>.+?) to (?P<recep>.+)$")
_TREAT = re.compile(r"^(?P<verb>clean|heat|cool) (?P<obj>.+?) with (?P<recep>.+)$")
_GO = re.compile(r"^go to (?P<recep>.+)$")
_USE = re.compile(r"^use (?P<lamp>.+)$")

MAX_DETOURS = 2
"""Most receptacles the expert searches before the walkthrough's source of an object."""
DETOUR_WEIGHTS = (0.2, 0.4, 0.4)
"""Probability of 0, 1 and 2 detours per object fetched."""

_PARTICIPLE = {"clean": "cleaned", "heat": "heated", "cool": "cooled"}


def _kind(name: str) -> str:
    """``"apple 1"`` -> ``"apple"``."""
    return name.rsplit(" ", 1)[0] if name.rsplit(" ", 1)[-1].isdigit() else name


class ALFWorldExpert:
    """The expert of one episode: ``expert(observation, admissible, rng) -> (thought, command)``, called once per
    turn from reset on, with what the game showed before the turn.

    The walkthrough gives the task's structure (what to fetch, how often, what to treat it with, where it goes);
    the commands come from the game's admissible list at each turn. With ``informed=True`` it searches nowhere
    before the walkthrough's sources.
    """

    def __init__(self, spec: Mapping[str, Any], env: Any, informed: bool = False) -> None:
        if not getattr(env, "walkthrough", None):
            raise ValueError(
                f"ALFWorld game {spec.get('game_file')} has no stored walkthrough, so it has no expert; generate "
                "games with `taspo-alfworld generate` (each generated game stores the planner's walkthrough)."
            )
        self.goal = env.task.rstrip(". ")
        self.informed = informed
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
        self.searched: set[str] = set()  # receptacles searched in vain for it
        self.taken_from = ""  # where the object in hand was picked up

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]:
        if self.stage >= len(self.stages):
            raise ValueError(f"The expert finished every stage of {self.goal!r} without a win.")
        commands = list(admissible or [])
        stage = self.stages[self.stage]
        if self.holding is not None and _kind(self.holding) != self.kind:
            return self._put_back(commands, rng)
        if stage == "fetch":
            return self._fetch(commands, rng)
        if stage == "treat":
            verb, recep = self.treat  # type: ignore[misc]
            obj = _kind(self.holding or self.kind)
            need = rng.choice((f"Next the {obj} gets {_PARTICIPLE[verb]}.", f"Next I {verb} the {obj}."))
            if self.at != recep:
                return self._go(recep, f"{need} Is the {_kind(recep)} here? " + rng.choice((
                    f"No; I go to the {recep}.", f"No; I bring it to the {recep}.",
                )))
            return f"{need} Is the {_kind(recep)} here? " + rng.choice((
                f"Yes, so I {verb} it.", f"Yes: I {verb} it now.",
            )), f"{verb} {self.holding} with {recep}"
        if stage == "place":
            return self._place(commands, rng)
        lamp, recep = self.lamp  # type: ignore[misc]
        thing = _kind(self.holding or self.kind)
        need = rng.choice((f"Light is needed for the {thing}.", f"Light is needed to see the {thing}."))
        if self.at != recep:
            return self._go(recep, f"{need} Is the {_kind(lamp)} here? " + rng.choice((
                "No; I go where it stands.", "No; it stands somewhere else.",
            )))
        return f"{need} Is the {_kind(lamp)} here? " + rng.choice((
            "Yes, so I switch it on.", f"Yes: I turn the {lamp} on.",
        )), f"use {lamp}"

    @staticmethod
    def _go(recep: str, thought: str) -> tuple[str, str]:
        return thought, f"go to {recep}"

    def _fetch(self, commands: list[str], rng: random.Random) -> tuple[str, str]:
        obj, missed = self.kind, None  # missed: the receptacle just searched in vain
        fresh = self.queue is None
        if fresh:
            self.queue = self._search_order(commands, rng)
        # Where the agent stands is searched, except the target after a first placement (its object is done).
        here = self.at if self.at is not None and not (self.placed and self.at == self.target) else None
        takes = [m for c in commands if (m := _TAKE.match(c)) and m["recep"] == here and _kind(m["obj"]) == obj]
        if here is not None and f"open {here}" in commands:
            return rng.choice((
                f"Closed: the {here} must be opened to see whether a {obj} is inside.",
                f"Closed as it is, the {here} hides what it holds; I open it.",
            )), f"open {here}"
        if takes:
            return rng.choice((
                f"Is a {obj} here? Yes, so I take {takes[0]['obj']}.",
                f"Is a {obj} here? Yes: I pick up {takes[0]['obj']}.",
            )), takes[0].group(0)
        if here is not None and not fresh:
            missed = here
            self.searched.add(here)
        self.queue = [r for r in self.queue if r not in self.searched and r != self.at and f"go to {r}" in commands]
        if not self.queue:  # the planned places are used up (someone moved the object): try the rest, likely first
            rest = [m["recep"] for c in commands if (m := _GO.match(c)) and m["recep"] not in self.searched]
            self.queue = sorted(rest, key=lambda recep: (not may_hold(recep, obj), recep))
        if not self.queue:
            raise ValueError(f"The expert searched every receptacle for a {obj} in vain ({self.goal!r}).")
        recep = self.queue[0]
        if missed is not None:
            thought = rng.choice((
                f"Is a {obj} here? No, so I will try another place.",
                f"Is a {obj} here? No; somewhere else might have one.",
            ))
        elif self.placed:
            thought = rng.choice((
                f"Another {obj} is needed: one is in place, and another place may have a second.",
                f"Another {obj} is still missing; I will look for it elsewhere.",
            ))
        else:
            thought = rng.choice((
                f"Looking for a {obj} first; I go to a likely place.",
                f"Looking for a {obj}, I will check where one may be.",
                f"Looking for the {obj} the task needs; I go where it may be.",
            ))
        return self._go(recep, thought)

    def _search_order(self, commands: list[str], rng: random.Random) -> list[str]:
        """Up to ``MAX_DETOURS`` other receptacles in random order, then the walkthrough's sources not yet used.

        Detours go only where ALFWorld can place this kind of object, as a searcher who knows how rooms are
        furnished would: that prior carries over to unseen rooms, where a random receptacle teaches nothing."""
        planned = self.sources[self.placed:] + self.sources[: self.placed]
        avoid = {*planned, self.target, self.at, self.treat and self.treat[1], self.lamp and self.lamp[1]}
        others = [
            m["recep"] for c in commands
            if (m := _GO.match(c)) and m["recep"] not in avoid and may_hold(m["recep"], self.kind)
        ]
        detours = 0 if self.informed else rng.choices(range(MAX_DETOURS + 1), weights=DETOUR_WEIGHTS)[0]
        return rng.sample(others, min(detours, len(others))) + list(dict.fromkeys(planned))

    def _place(self, commands: list[str], rng: random.Random) -> tuple[str, str]:
        target, obj = self.target, _kind(self.holding or self.kind)
        question = f"Holding the {obj}, is the {_kind(target)} here?"  # type: ignore[arg-type]
        if self.at != target:
            return self._go(target, f"{question} " + rng.choice((  # type: ignore[arg-type]
                f"No, so I head to the {target}.", f"No; I carry it to the {target}.",
            )))
        if f"open {target}" in commands:
            return rng.choice((
                f"Closed: the {target} must be opened before the {obj} can go in.",
                f"Closed as it is, the {target} cannot take the {obj}; I open it.",
            )), f"open {target}"
        return f"{question} " + rng.choice((
            "Yes, so I put it there.", "Yes: I place it here.",
        )), f"move {self.holding} to {target}"

    def _put_back(self, commands: list[str], rng: random.Random) -> tuple[str, str]:
        """The agent holds an object of the wrong kind (another's choice): put it down where it stands, or where
        it was taken from when this place is closed."""
        held, kind = self.holding, _kind(self.holding or "")
        moves = [c for c in commands if (m := _MOVE.match(c)) and m["obj"] == held]
        if moves:
            here = next((c for c in moves if _MOVE.match(c)["recep"] == self.at), moves[0])  # type: ignore[index]
            return rng.choice((
                f"Wrong object: {held} is not the {self.kind} the task needs, so I put it down.",
                f"Wrong kind of thing in hand; a {kind} is no {self.kind}. I set it down first.",
            )), here
        if self.at is not None and f"open {self.at}" in commands:
            return f"Wrong object in hand, a {kind}; I open the {self.at} to put it down.", f"open {self.at}"
        return self._go(self.taken_from, f"Wrong object in hand, a {kind}; I take it back to the {self.taken_from}.")

    def agrees(self, command: str, suggested: str) -> bool:
        """Whether ``command`` is as good a move as the expert's ``suggested`` one (asked for this turn): the same
        command, or, while searching for the object, going to another unsearched receptacle that may hold it.
        Relabelling gives a policy's turn a correction only where the expert does not agree."""
        said = normalize_command(command)
        if said == normalize_command(suggested):
            return True
        searching = self.stage < len(self.stages) and self.stages[self.stage] == "fetch" and self.holding is None
        match = _GO.match(said)
        return bool(
            searching and match and _GO.match(suggested) and match["recep"] != self.at
            and match["recep"] not in self.searched and may_hold(match["recep"], self.kind)
        )

    def observe(self, command: str, admissible: list[str] | None) -> None:
        """Follow the command the game just played, the expert's own or anyone else's, given the admissible
        commands shown before it (a command outside that list changed nothing). Expert demonstrations call it
        after every turn; relabelling a policy's episode calls it with the policy's commands, so the expert's
        next suggestion starts from wherever the policy went."""
        said = normalize_command(command)
        if not said or said not in {normalize_command(c) for c in admissible or []}:
            return
        stage = self.stages[self.stage] if self.stage < len(self.stages) else None
        if match := _GO.match(said):
            self.at = match["recep"]
        elif match := _TAKE.match(said):
            self.holding, self.at = match["obj"], match["recep"]
            self.taken_from = match["recep"]
            if stage == "fetch" and _kind(match["obj"]) == self.kind:
                self.stage += 1
                self.queue = None
                self.searched = set()
        elif match := _MOVE.match(said):
            self.holding = None
            if _kind(match["obj"]) != self.kind:
                return
            if stage == "place" and match["recep"] == self.target:
                self.placed += 1
                self.stage += 1
            elif stage in ("treat", "place", "use"):  # the object the task needs was put down elsewhere: refetch
                self.stage = max(i for i in range(self.stage) if self.stages[i] == "fetch")
        elif match := _TREAT.match(said):
            wanted = self.treat[0] if self.treat else None
            if stage == "treat" and match["verb"] == wanted:
                self.stage += 1
            elif {match["verb"], wanted} == {"heat", "cool"} and "treat" in self.stages[: self.stage]:
                self.stage = self.stages.index("treat")  # cooling the heated object undoes the heating, and back
        elif _USE.match(said) and stage == "use":
            self.stage += 1
