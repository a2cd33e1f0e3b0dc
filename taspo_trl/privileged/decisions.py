"""Decision states and cross-rollout correspondence for AlignOPSD (the README's "AlignOPSD" section).

A turn's decision state is the encoder embedding of its ``<think>`` text; the candidate sources of a target
turn are the turns of the OTHER rollouts of the same task. This module turns a task group's trajectories into
the matrices ``taspo_trl.credit.alignopsd.align_trajectory`` consumes (similarities, sibling ids, structural
validity, action consistency) and returns the per-turn correspondences with the source (trajectory, turn) keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..credit.alignopsd import TurnCorrespondence, align_trajectory
from ..envs.base import ACTION_TAGS
from ..rollout.records import Trajectory
from .encoder import cosine_matrix

_THINK = re.compile(r"<think>(.*?)</think>", re.IGNORECASE | re.DOTALL)
_BLOCK = re.compile(rf"<({'|'.join(ACTION_TAGS)})>.*?</\1>", re.IGNORECASE | re.DOTALL)
_OPERATION = re.compile(r"^\s*([a-z_]+)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


def think_text(response_text: str) -> str:
    """The reasoning of a response: its ``<think>`` block, else the text around the action block."""
    match = _THINK.search(response_text)
    text = match.group(1) if match else _BLOCK.sub(" ", response_text)
    return " ".join(text.split())


def operation_and_target(action: str) -> tuple[str, str]:
    """WebShop-style ``click[Buy Now]`` -> ("click", "buy now"); other actions -> (first word, rest)."""
    match = _OPERATION.match(action)
    if match:
        return match.group(1).lower(), " ".join(match.group(2).lower().split())
    words = action.lower().split()
    return (words[0] if words else ""), " ".join(words[1:])


@dataclass
class GroupStates:
    """Embeddings of every turn of a group's trajectories, flattened in (trajectory, turn) order."""

    keys: list[tuple[int, int]]
    thinking: torch.Tensor
    actions: torch.Tensor


def embed_group(trajectories: Sequence[Trajectory], members: Sequence[int], encoder: Any) -> GroupStates:
    """Encodes the thinking and action text of every turn of ``members`` (indices into ``trajectories``)."""
    keys = [(i, t) for i in members for t in range(trajectories[i].num_turns)]
    turns = [trajectories[i].turns[t] for i, t in keys]
    thinking = encoder.encode([think_text(turn.response_text) or "(no reasoning)" for turn in turns])
    actions = encoder.encode([turn.action or "(no action)" for turn in turns])
    return GroupStates(keys, thinking, actions)


def target_correspondence(
    trajectories: Sequence[Trajectory],
    target: int,
    states: GroupStates,
    *,
    exact_action_match: bool = False,
    target_thinking: torch.Tensor | None = None,
    **align_kwargs: Any,
) -> tuple[list[TurnCorrespondence], list[tuple[int, int]]]:
    """Correspondence of every turn of ``target`` over the turns of its siblings in ``states``.

    ``target_thinking`` ([target turns, dim]) replaces the target's own decision states: the teacher-side states,
    embeddings of the thinking the policy generates under the privileged view. Sources keep their own thinking.

    Structurally valid sources are turns with a valid action block; the action-consistency inputs compare the
    target's and source's actions (embedding cosine; with ``exact_action_match``, WebShop's rule of the same
    operation and the identical click target). Returns the correspondences and the (trajectory, turn) key of
    every candidate column.
    """
    target_rows = [n for n, (i, _) in enumerate(states.keys) if i == target]
    source_rows = [n for n, (i, _) in enumerate(states.keys) if i != target]
    columns = [states.keys[n] for n in source_rows]
    if not target_rows:
        return [], columns
    target_turns = [trajectories[target].turns[states.keys[n][1]] for n in target_rows]
    source_turns = [trajectories[i].turns[t] for i, t in columns]
    target_states = states.thinking[target_rows] if target_thinking is None else target_thinking
    if target_states.size(0) != len(target_rows):
        raise ValueError(f"target_thinking has {target_states.size(0)} rows for {len(target_rows)} target turns")
    similarity = cosine_matrix(target_states, states.thinking[source_rows]).double()
    action_similarity = cosine_matrix(states.actions[target_rows], states.actions[source_rows]).double()
    valid = torch.tensor([turn.action_valid for turn in source_turns], dtype=torch.bool)
    parsed = torch.tensor([[a.action_valid and b.action_valid for b in source_turns] for a in target_turns], dtype=torch.bool)
    extra: dict[str, torch.Tensor] = {}
    if exact_action_match:
        ops = [[operation_and_target(a.action), operation_and_target(b.action)] for a in target_turns for b in source_turns]
        shape = (len(target_turns), len(source_turns))
        extra["same_operation"] = torch.tensor([x[0] == y[0] for x, y in ops]).reshape(shape)
        extra["same_click_target"] = torch.tensor([x[0] != "click" or x[1] == y[1] for x, y in ops]).reshape(shape)
    correspondences = align_trajectory(
        similarity,
        [i for i, _ in columns],
        valid,
        action_similarity=action_similarity,
        actions_parsed=parsed,
        **extra,
        **align_kwargs,
    )
    return correspondences, columns
