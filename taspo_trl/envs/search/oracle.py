"""A scripted oracle for the embedded questions: search each hop's entity, then answer.

It checks what it reads: each hop's fact must appear in the ``<information>`` it got back (that is how it would
learn the next entity to search), otherwise it gives up with a wrong answer. Its success rate therefore
measures how answerable the embedded set is through the retriever, not just the scoring.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ..base import StepResult
from .data import load_embedded_questions
from .env import SearchQAEnv

_GIVE_UP = "<answer>unknown</answer>"


def _embedded_question(spec: Mapping[str, Any]) -> dict[str, Any]:
    question = spec.get("question", spec.get("task"))
    for split in ("train", "test"):
        for row in load_embedded_questions(split):
            if row["id"] == spec.get("id") and row["question"] == question:
                return row
    raise ValueError(f"No embedded Search-QA question with id {spec.get('id')!r} and text {question!r}; the oracle only knows the embedded set.")


def oracle_actions(spec: Mapping[str, Any]) -> list[str]:
    """The scripted action sequence for an embedded task spec: one search per hop, then the gold answer."""
    row = _embedded_question(spec)
    return [f"<search>{hop['search']}</search>" for hop in row["hops"]] + [f"<answer>{row['golden_answers'][0]}</answer>"]


def play_oracle(env: SearchQAEnv, spec: Mapping[str, Any]) -> StepResult:
    """Play ``env`` (already reset) with the oracle; it answers only what it found in the observations."""
    row = _embedded_question(spec)
    result = StepResult("", 0.0, False, {})
    for hop in row["hops"]:
        result = env.step(f"<search>{hop['search']}</search>")
        if result.done:
            return result
        if hop["reveals"] not in result.observation:
            return env.step(_GIVE_UP)
    return env.step(f"<answer>{row['golden_answers'][0]}</answer>")


class SearchExpert:
    """The oracle as the expert of one episode: ``expert(observation, admissible, rng) -> (thought, action)``.

    It searches each hop's entity, then answers; each thought says what the question still needs and, after a
    search, which fact the results gave.
    """

    def __init__(self, spec: Mapping[str, Any], env: Any) -> None:
        row = _embedded_question(spec)
        self.question = row["question"]
        self.hops = list(row["hops"])
        self.answer = row["golden_answers"][0]
        self.step = 0

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]:
        pick = rng.choice
        found = self.hops[self.step - 1]["reveals"] if self.step > 0 else None
        if self.step < len(self.hops):
            entity = self.hops[self.step]["search"]
            if found is None:
                thought = pick((
                    f"To answer this I first need facts about {entity}. I will search for it.",
                    f"The question hinges on {entity}; let me look that up.",
                ))
            else:
                thought = pick((
                    f"The results point to {found}, which gives me {entity} to look up next.",
                    f"I learned {found} from the passages. Now I need to know about {entity}.",
                ))
            action = f"<search>{entity}</search>"
        else:
            thought = pick((
                f"The passages state {found}, which answers the question.",
                f"From the retrieved text the answer is {found}.",
            )) if found else f"I know enough to answer: {self.answer}."
            action = f"<answer>{self.answer}</answer>"
        self.step += 1
        return thought, action
