"""AlignOPSD's privileged side: the privileged information p_x of every task, the parsed thinking and action of
student and teacher responses, each task group's correspondence matrices, and the cross-teacher views to score.

The official trainer (``ThinkingCorrespondenceRayTrainer._compute_teacher_log_probs`` in ``mingju-c/Align-OPSD``)
generates one privileged (teacher) response per turn, embeds the teacher's and the student's ``<think>`` text
with a frozen encoder, and matches the TEACHER's thinking at a source turn against the STUDENT's thinking at the
target turn. The stage math on what this module builds is in ``taspo_trl.credit.alignopsd``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..credit.alignopsd import (
    action_consistent_sources,
    adjacent_profile_distances,
    dense_profiles,
    select_sources,
    structural_eligibility,
)
from ..rollout.chat import ChatFormat
from ..rollout.records import Trajectory
from .rescoring import privileged_prompt_ids
from .skillbank import SKILLS_FOOTER, SKILLS_HEADER, SkillBank

_THINK = re.compile(r"<think\b[^>]*>(.*?)</think\s*>", re.IGNORECASE | re.DOTALL)
# The official parser's action blocks, tried in this order: ALFWorld/WebShop actions, Search-QA queries, answers.
_ACTIONS = tuple(
    re.compile(rf"<{tag}\b[^>]*>(.*?)</{tag}\s*>", re.IGNORECASE | re.DOTALL) for tag in ("action", "search", "answer")
)


def parse_response(text: str) -> tuple[str, str]:
    """(thinking, action) of a response, as the official ``parse_tagged_response`` reads it: the content of the
    first ``<think>`` block and of the first ``<action>`` (else ``<search>``, else ``<answer>``) block, stripped;
    "" where there is none. Empty thinking makes a turn structurally ineligible."""
    think = _THINK.search(text)
    action = next((m for m in (p.search(text) for p in _ACTIONS) if m), None)
    return (think.group(1).strip() if think else ""), (action.group(1).strip() if action else "")


# The teacher's privileged block when retrieval gives no skill (k = 0, an empty bank, none for the task type): the
# official ``build_teacher_batch`` always builds the teacher prompt, with an empty skill text under its header.
NO_SKILLS = f"{SKILLS_HEADER}\n{SKILLS_FOOTER}"


def skill_contexts(skill_bank: SkillBank, trajectories: Sequence[Trajectory], top_k: int) -> list[str]:
    """p_x of every trajectory: the top-k SkillBank skills of its task rendered as one block ("" when none)."""
    skills = skill_bank.retrieve_batch([t.task for t in trajectories], top_k, [t.task_type for t in trajectories])
    return [skill_bank.render(s) if s else "" for s in skills]


def teacher_contexts(contexts: Sequence[str]) -> list[str]:
    """The teacher's privileged block of every trajectory: its skills, or ``NO_SKILLS`` where it has none, so
    every trajectory has a teacher, as in the official trainer."""
    return [context or NO_SKILLS for context in contexts]


def teacher_prompts(
    trajectories: Sequence[Trajectory], wanted: Sequence[int], contexts: Sequence[str], chat: ChatFormat
) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """The teacher's prompt for every turn of the ``wanted`` trajectories (p_x in front of the turn's context,
    the official teacher batch), and the (trajectory, turn) each one belongs to."""
    keys = [(i, t) for i in wanted for t in range(trajectories[i].num_turns)]
    return [privileged_prompt_ids(trajectories[i], t, contexts[i], chat) for i, t in keys], keys


@dataclass
class GroupCorrespondence:
    """One task group's matrices over its M turns, in (member, turn) order (``keys``).

    Attributes:
        keys: (trajectory index into the gathered batch, turn) of every row / column.
        similarity: H[source, target], teacher thinking at the source vs student thinking at the target.
        eligible: B[source, target] (``structural_eligibility``).
        selected: each target's kept sources (row indices), after selection and the optional action filter.
        profiles, profile_valid: the dense profiles P[target, source] and their validity.
        distances, boundary_valid: the adjacent-profile distance into each turn, and whether it counts.
    """

    keys: list[tuple[int, int]]
    similarity: torch.Tensor
    eligible: torch.Tensor
    selected: list[tuple[int, ...]]
    profiles: torch.Tensor
    profile_valid: torch.Tensor
    distances: torch.Tensor
    boundary_valid: torch.Tensor

    def rows_of(self, trajectory: int) -> list[int]:
        """The rows of one member trajectory, in turn order."""
        return [n for n, (i, _) in enumerate(self.keys) if i == trajectory]


def _cosines(encoder: Any, sources: Sequence[str], targets: Sequence[str]) -> torch.Tensor:
    """Cosine [source, target] of two lists of texts, 0 wherever either text is empty: an empty text is never
    embedded (it is structurally ineligible, so its entries are never read). Whitespace is collapsed first, as the
    official encoder's ``preprocess`` does.

    Each distinct text is embedded once and each pair of distinct texts gets one cosine, so two turns with the same
    thinking tie exactly and ``select_sources`` breaks the tie by its stated order. (Embedding duplicates, or
    reading their cosines from different cells of one matrix product, gave values that differ in the last bits on
    an AVX2-only CPU, so such ties went by rounding.)"""
    sources, targets = [" ".join(x.split()) for x in sources], [" ".join(x.split()) for x in targets]
    out = torch.zeros(len(sources), len(targets), dtype=torch.float64)
    rows, cols = [k for k, x in enumerate(sources) if x], [k for k, x in enumerate(targets) if x]
    if rows and cols:
        distinct = list(dict.fromkeys([sources[k] for k in rows] + [targets[k] for k in cols]))
        position = {text: n for n, text in enumerate(distinct)}
        encoded = torch.nn.functional.normalize(encoder.encode(distinct).double(), dim=-1)
        cosine = (encoded @ encoded.T).clamp(-1.0, 1.0)
        source_at = torch.tensor([position[sources[k]] for k in rows])
        target_at = torch.tensor([position[targets[k]] for k in cols])
        out[torch.tensor(rows)[:, None], torch.tensor(cols)[None, :]] = cosine[source_at[:, None], target_at[None, :]]
    return out


def group_correspondence(
    everything: Sequence[Trajectory],
    members: Sequence[int],
    teacher: dict[tuple[int, int], tuple[str, str]],
    encoder: Any,
    *,
    threshold: float,
    top_k: int,
    action_filter: bool,
    action_threshold: float,
    profile_temperature: float,
    profile_distance: str,
) -> GroupCorrespondence:
    """Mechanism 1's selection and mechanism 2's profiles for one task group.

    ``teacher`` maps (trajectory, turn) to the teacher's (thinking, action) there. The student's thinking and
    action are parsed from the sampled responses. With ``action_filter`` the teacher's action at the source and
    the student's action at the target are embedded and compared (WebShop also needs the same operation and the
    identical click target, as the official filter does when the environment is WebShop).
    """
    keys = [(i, t) for i in members for t in range(everything[i].num_turns)]
    student = [parse_response(everything[i].turns[t].response_text) for i, t in keys]
    teacher_parsed = [teacher.get(key, ("", "")) for key in keys]
    rollouts = [i for i, _ in keys]
    b = structural_eligibility(rollouts, [bool(th) for th, _ in teacher_parsed], [bool(th) for th, _ in student])
    h = _cosines(encoder, [th for th, _ in teacher_parsed], [th for th, _ in student])
    selected = select_sources(h, b, rollouts, threshold=threshold, top_k=top_k)
    if action_filter and any(selected):
        teacher_actions = [a for _, a in teacher_parsed]
        student_actions = [a for _, a in student]
        actions = _cosines(encoder, teacher_actions, student_actions)
        webshop = bool(keys) and everything[keys[0][0]].env_name.lower() == "webshop"
        selected = action_consistent_sources(
            selected, actions, teacher_actions, student_actions, action_threshold, webshop=webshop
        )
    profiles, valid = dense_profiles(h, b, threshold=threshold, temperature=profile_temperature)
    trajectory_rows = [[n for n, (i, _) in enumerate(keys) if i == member] for member in members]
    distances, boundary_valid = adjacent_profile_distances(profiles, valid, b, trajectory_rows, profile_distance)
    return GroupCorrespondence(keys, h, b, selected, profiles, valid, distances, boundary_valid)


def cross_view_requests(
    correspondence: GroupCorrespondence,
    target: int,
    everything: Sequence[Trajectory],
    contexts: Sequence[str],
    chat: ChatFormat,
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[int, int]]]:
    """The cross-teacher views of one target trajectory (official ``compose_cross_teacher_inputs``): for every
    selected source of each of its turns, the source's teacher prompt (p_x and the source's context) followed by
    the TARGET's sampled response; and the (target turn, source row) of each view."""
    requests, owners = [], []
    for row in correspondence.rows_of(target):
        _, t = correspondence.keys[row]
        for source in correspondence.selected[row]:
            j, u = correspondence.keys[source]
            requests.append((privileged_prompt_ids(everything[j], u, contexts[j], chat), everything[target].turns[t].response_ids))
            owners.append((t, source))
    return requests, owners
