"""ALFWorld's rules for the rule-based analyzer (``analyzer: rule``), registered as ``"alfworld"`` in
``taspo_trl.envs``: ALFWorld commands ("take apple 1 from countertop 1") parsed into verb, object and receptacle."""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ..analysis import Candidate, Candidates, Step, add_candidate, effective_steps, mentions

_KEY_VERBS = ("take", "put", "heat", "cool", "clean", "slice", "use")
_COMMAND_FORMS = (
    ("goto", re.compile(r"go to (?P<rec>.+)")),
    ("take", re.compile(r"take (?P<obj>.+?) from (?P<rec>.+)")),
    ("put", re.compile(r"(?:move|put) (?P<obj>.+?) (?:to|in/on|into|onto|in|on) (?P<rec>.+)")),
    ("open", re.compile(r"open (?P<rec>.+)")),
    ("close", re.compile(r"close (?P<rec>.+)")),
    ("heat", re.compile(r"heat (?P<obj>.+?) with (?P<rec>.+)")),
    ("cool", re.compile(r"cool (?P<obj>.+?) with (?P<rec>.+)")),
    ("clean", re.compile(r"clean (?P<obj>.+?) with (?P<rec>.+)")),
    ("slice", re.compile(r"slice (?P<obj>.+?) with (?P<rec>.+)")),
    ("use", re.compile(r"use (?P<obj>.+)")),
    ("examine", re.compile(r"examine (?P<obj>.+)")),
)
_FAILED = "nothing happens"


@dataclass(frozen=True)
class Command:
    """An ALFWorld command split into verb, object and receptacle (instance names such as "apple 1")."""

    verb: str
    obj: str
    rec: str

    @property
    def entities(self) -> tuple[str, ...]:
        return tuple(name for name in (self.obj, self.rec) if name)


def parse_command(action: str) -> Command | None:
    """Parse an ALFWorld command ("take apple 1 from countertop 1", "move apple 1 to fridge 1", ...)."""
    text = " ".join(action.lower().split())
    for verb, form in _COMMAND_FORMS:
        match = form.fullmatch(text)
        if match:
            groups = match.groupdict()
            return Command(verb, groups.get("obj") or "", groups.get("rec") or "")
    return None


def entity_type(name: str) -> str:
    """The type of an instance name ("apple 1" -> "apple"), so items group the same kind of step across runs."""
    return re.sub(r"\s+\d+$", "", name)


def _phrase(command: Command) -> str:
    obj, rec = entity_type(command.obj), entity_type(command.rec)
    return {
        "take": f"take the {obj} from the {rec}",
        "put": f"put the {obj} in/on the {rec}",
        "use": f"use the {obj}",
    }.get(command.verb, f"{command.verb} the {obj} with the {rec}")


class ALFWorldRules:
    """From the successes' effective actions (not answered "Nothing happens.") on things the task names ("key
    actions": take / move / heat / cool / clean / slice / use):
      (a) requirements: each key action the successes performed;
      (b) preconditions: the "go to R" and "open R" that preceded a key action on receptacle R;
      (c) ordering: consecutive key actions, in the order the successes did them (pairs some success
          reversed are dropped).
    An item's anchors are the objects and receptacles its source actions name."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[Candidate]:
        candidates: Candidates = {}
        reversed_pairs: set[tuple] = set()
        for success in successes:
            steps = effective_steps(success, parse_command, _FAILED)
            keys = [s for s in steps if s.command.verb in _KEY_VERBS and self._on_task(s.command, task)]
            for step in keys:
                self._requirement(candidates, step)
                self._preconditions(candidates, step, steps)
            self._orderings(candidates, reversed_pairs, keys)
        return [c for key, c in candidates.items() if key not in reversed_pairs]

    def anchors(self, action: str, task: str) -> list[str] | None:
        command = parse_command(action)
        return None if command is None else list(command.entities)

    def kind(self, action: str) -> str:
        command = parse_command(action)
        return command.verb if command else ""

    @staticmethod
    def _on_task(command: Command, task: str) -> bool:
        return any(mentions(task, entity_type(name)) for name in command.entities)

    @staticmethod
    def _requirement(candidates: Candidates, step: Step) -> None:
        c = step.command
        statement = f'Required: {_phrase(c)} ("{step.action}").'
        key = ("requirement", c.verb, entity_type(c.obj), entity_type(c.rec))
        add_candidate(candidates, key, "requirement", statement).support(step.trajectory_id, [step.reference(c.entities)])

    @staticmethod
    def _preconditions(candidates: Candidates, step: Step, steps: list[Step]) -> None:
        """The latest "go to R" (and "open R" after it) before a key action on receptacle R."""
        c = step.command
        target = c.rec
        if c.verb in ("use", "slice") or not target:  # these act on a held tool or device, not at a receptacle
            return
        earlier = [s for s in steps if s.step < step.step]
        goto = next((s for s in reversed(earlier) if s.command.verb == "goto" and s.command.rec == target), None)
        after_goto = [s for s in earlier if goto is None or s.step > goto.step]
        opened = next((s for s in reversed(after_goto) if s.command.verb == "open" and s.command.rec == target), None)
        for before, verb in ((goto, "Go to"), (opened, "Open")):
            if before is None:
                continue
            statement = f'{verb} the {entity_type(target)} before you {_phrase(c)} ("{before.action}").'
            key = ("precondition", before.command.verb, entity_type(target), c.verb, entity_type(c.obj))
            refs = [before.reference([target, c.obj]), step.reference(c.entities)]
            add_candidate(candidates, key, "precondition", statement).support(step.trajectory_id, refs)

    @staticmethod
    def _orderings(candidates: Candidates, reversed_pairs: set[tuple], keys: list[Step]) -> None:
        firsts: dict[tuple, Step] = {}
        for step in keys:
            firsts.setdefault((step.command.verb, entity_type(step.command.obj), entity_type(step.command.rec)), step)
        ordered = list(firsts.items())
        for (sig_a, a), (sig_b, b) in pairwise(ordered):
            reversed_pairs.add(("ordering", sig_b, sig_a))
            statement = (
                f'{_phrase(a.command).capitalize()} before you {_phrase(b.command)} ("{a.action}", then "{b.action}").'
            )
            refs = [a.reference(a.command.entities), b.reference(b.command.entities)]
            add_candidate(candidates, ("ordering", sig_a, sig_b), "ordering", statement).support(a.trajectory_id, refs)



__all__ = ["ALFWorldRules", "Command", "entity_type", "parse_command"]
