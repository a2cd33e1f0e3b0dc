"""Progress labels for Search-QA actions: did the action find what the question needs, or answer it?

A search made progress when its results hold a fact the episode had not seen yet that the answer depends on:
each hop's revealed entity for the embedded questions (``hops[i]["reveals"]``, the bridge entity of a two-hop
question, then the answer), a gold answer for datasets without hops. An answer made progress when it is right
(exact match after SQuAD normalisation). Anything else, a repeated search or a turn without a valid action, made
none. The Search-QA counterpart of ALFWorld's planner distances, for ``benchmarks/credit_quality.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .scoring import exact_match, normalize_answer

_BLOCK = re.compile(r"^\s*<(search|answer)>(.*)</\1>\s*$", re.DOTALL)


def needed_facts(spec: Mapping[str, Any]) -> list[str]:
    """What the question's answer depends on: the embedded question's revealed hop entities, else its gold answers."""
    from .oracle import _embedded_question

    try:
        return [hop["reveals"] for hop in _embedded_question(spec)["hops"]]
    except ValueError:
        return list(spec["golden_answers"])


def search_progress(spec: Mapping[str, Any], commands: Sequence[str], observations: Sequence[str]) -> list[bool]:
    """One label per action: ``commands[t]`` is the canonical block the environment received (``""`` for no valid
    action) and ``observations[t]`` what came back."""
    if len(commands) != len(observations):
        raise ValueError(f"{len(commands)} commands for {len(observations)} observations")
    pending = {normalize_answer(fact): fact for fact in needed_facts(spec)}
    labels = []
    for command, observation in zip(commands, observations):
        block = _BLOCK.match(command or "")
        if block is None:
            labels.append(False)
        elif block.group(1) == "answer":
            labels.append(exact_match(block.group(2), spec["golden_answers"]) == 1.0)
        else:
            seen = normalize_answer(re.sub(r"[^\w\s]", " ", observation))  # tags and brackets split words
            found = [key for key in pending if key and re.search(rf"\b{re.escape(key)}\b", seen)]
            for key in found:
                del pending[key]
            labels.append(bool(found))
    return labels
