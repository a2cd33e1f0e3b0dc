"""AlignOPSD's privileged side, one stage each: the privileged information p_x of every task, the decision
correspondence of a batch's trajectories over their siblings, and the aligned views to rescore (the target's
response teacher-forced under each matched source's history with p_x). The gap and weight math on what these
return is in ``taspo_trl.credit.alignopsd``; docs/methods.md numbers its equations.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..credit.alignopsd import TurnCorrespondence
from ..rollout.chat import ChatFormat
from ..rollout.records import Trajectory
from .decisions import GroupStates, embed_group, target_correspondence
from .rescoring import privileged_prompt_ids
from .skillbank import SkillBank

Correspondences = dict[int, tuple[list[TurnCorrespondence], list[tuple[int, int]]]]
"""Per target trajectory (index into the local batch): one correspondence per turn, and the (trajectory, turn)
key of every candidate column, trajectory indices into the gathered batch."""

AlignedView = tuple[int, int, int]
"""(target trajectory, target turn, source column) of one aligned view."""


def skill_contexts(skill_bank: SkillBank, trajectories: Sequence[Trajectory], top_k: int) -> list[str]:
    """p_x of every trajectory: the top-k SkillBank skills of its task rendered as one block ("" when none)."""
    skills = skill_bank.retrieve_batch([t.task for t in trajectories], top_k, [t.task_type for t in trajectories])
    return [skill_bank.render(s) if s else "" for s in skills]


def active_contexts(contexts: Sequence[str], advantages: torch.Tensor) -> list[str]:
    """The contexts of the trajectories whose credit can move: a zero advantage stays zero under any weights,
    so those get "" and are neither rescored nor matched."""
    return [context if float(advantage) != 0.0 else "" for context, advantage in zip(contexts, advantages, strict=True)]


def batch_correspondences(
    everything: Sequence[Trajectory],
    first: int,
    active: Sequence[str],
    encoder: Any,
    teacher_states: Mapping[int, torch.Tensor],
    *,
    exact_action_match: bool,
    **align_kwargs: Any,
) -> Correspondences:
    """Correspondence of every turn of each active local trajectory over its siblings' turns.

    ``everything`` is the gathered batch, the local trajectories start at ``first`` and ``active`` is theirs. A
    group's turns are encoded once, however many of its trajectories are targets. ``teacher_states`` replaces a
    target's own decision states (``target_correspondence``'s ``target_thinking``)."""
    states_by_group: dict[int, GroupStates] = {}
    out: Correspondences = {}
    for i, context in enumerate(active):
        if not context:
            continue
        group = everything[first + i].group
        if group not in states_by_group:
            members = [j for j, t in enumerate(everything) if t.group == group]
            states_by_group[group] = embed_group(everything, members, encoder)
        out[i] = target_correspondence(
            everything, first + i, states_by_group[group],
            exact_action_match=exact_action_match, target_thinking=teacher_states.get(i), **align_kwargs,
        )
    return out


def aligned_view_requests(
    correspondences: Correspondences,
    targets: Sequence[Trajectory],
    everything: Sequence[Trajectory],
    contexts: Sequence[str],
    chat: ChatFormat,
) -> tuple[list[tuple[list[int], list[int]]], list[AlignedView]]:
    """One (prompt ids, response ids) pair per kept source of every target turn: the target's response under
    the source's history with the source's p_x (``contexts`` runs over ``everything``), and whose view it is."""
    requests, owners = [], []
    for i, (per_turn, columns) in correspondences.items():
        for t, match in enumerate(per_turn):
            for source in match.sources:
                j, u = columns[source]
                prompt = privileged_prompt_ids(everything[j], u, contexts[j], chat)
                requests.append((prompt, targets[i].turns[t].response_ids))
                owners.append((i, t, source))
    return requests, owners
