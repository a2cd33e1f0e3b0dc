"""Paired rescoring (TASPO Eq. 3): the frozen rollout snapshot scores each sampled response with and without
the privileged context P_i.

The plain pass log pi_old(y | h) is what the trainer already has (``AgentGRPOTrainer._plain_logprobs``: the
snapshot's log-probs from the same forward, TRL's ``old_per_token_logps`` or the transformers backend's sampling
log-probs, rescored only when neither is that forward). Only the privileged pass runs here: the same rows with
P_i put in front of the row's first user message, the response tokens unchanged, under no grad, through the
trainer's own chunked log-prob function with dropout off (so LoRA adapters, DeepSpeed ZeRO-3 and the fused LM
head behave as in the loss, and two passes over the same input agree). Only trajectories that can use the
result (P_i non-empty and A_i != 0) are rescored, so the pass costs at most one forward over the rows.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..rollout.chat import ChatFormat
from ..rollout.layouts import NOT_POLICY, Rows
from ..rollout.records import Trajectory

LogProbFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(input_ids, attention_mask, logits_to_keep) -> per-token log-probs of the last ``logits_to_keep`` tokens."""


def privileged_user_text(privileged_info: str, user_text: str) -> str:
    """Where P_i goes: before the original user message, so h_it and the response stay as they were."""
    return f"{privileged_info}\n\n{user_text}"


def privileged_prompt_ids(trajectory: Trajectory, turn: int, privileged_info: str, chat: ChatFormat) -> list[int]:
    """The prompt of ``turn`` with P_i in front of the first user message; the rest of the history unchanged.

    ``turn`` layout: the turn's own prompt is one user message. ``sequence`` layout: the history after the
    first user message is kept token for token (the prompt ids extend the first prompt's ids)."""
    first = trajectory.turns[0]
    prompt = trajectory.turns[turn].prompt_ids
    if prompt[: len(first.prompt_ids)] == first.prompt_ids:  # sequence layout, or the first turn
        return chat.first_prompt_ids(privileged_user_text(privileged_info, first.prompt_text)) + prompt[len(first.prompt_ids) :]
    return chat.first_prompt_ids(privileged_user_text(privileged_info, trajectory.turns[turn].prompt_text))


def score_continuations(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    logprob_fn: LogProbFn,
    pad_token_id: int,
    min_rows: int = 0,
    batch_size: int = 8,
) -> list[torch.Tensor]:
    """log-probs of each continuation given its prompt.

    Rows are sorted by length and scored ``batch_size`` at a time, each chunk padded only to its own longest
    row (privileged prompts vary a lot in length, and padding every row to the batch maximum would waste most
    of the pass). ``min_rows`` pads with one-token rows so every process runs the same number of forward passes.
    """
    pairs = list(pairs) + [([pad_token_id], [pad_token_id])] * max(0, min_rows - len(pairs))
    order = sorted(range(len(pairs)), key=lambda k: len(pairs[k][0]) + len(pairs[k][1]))
    out: list[torch.Tensor | None] = [None] * len(pairs)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width_p = max(len(pairs[k][0]) for k in chunk)
        width_c = max(len(pairs[k][1]) for k in chunk)
        input_ids = torch.full((len(chunk), width_p + width_c), pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, k in enumerate(chunk):
            p, c = pairs[k]
            input_ids[row, width_p - len(p) : width_p] = torch.tensor(list(p))
            input_ids[row, width_p : width_p + len(c)] = torch.tensor(list(c))
            attention[row, width_p - len(p) : width_p + len(c)] = 1
        with torch.no_grad():
            logps = logprob_fn(input_ids, attention, width_c).float().cpu()
        for row, k in enumerate(chunk):
            out[k] = logps[row, : len(pairs[k][1])]
    return out  # type: ignore[return-value]


def rescored_rows(rows: Rows, pi_texts: Sequence[str]) -> list[int]:
    """Indices of the rows the privileged pass scores: those of a trajectory with a non-empty ``pi_texts`` entry
    that hold a policy token. A trajectory whose environment failed at reset has no turn, and in the ``sequence``
    layout a placeholder row without policy tokens: there is nothing to score, and no turn to anchor P_i to."""
    return [
        r
        for r, traj in enumerate(rows.row_trajectory)
        if traj != NOT_POLICY and pi_texts[traj] and any(turn != NOT_POLICY for turn in rows.token_turn[r])
    ]


def privileged_token_shifts(
    rows: Rows,
    trajectories: Sequence[Trajectory],
    pi_texts: Sequence[str],
    chat: ChatFormat,
    logprob_fn: LogProbFn,
    plain_logprobs: torch.Tensor,
    pad_token_id: int,
    min_rows: int = 0,
    action_only: bool = True,
    batch_size: int = 8,
) -> dict[tuple[int, int], torch.Tensor]:
    """Eq. 3 shifts Delta_itk of each rescored turn, keyed by (trajectory, turn): over the ACTION span (TASPO),
    or over the whole response with ``action_only=False`` (AlignOPSD's local gap g0).

    The ``rescored_rows`` are scored with P_i in their prompt; the response (and, in the ``sequence`` layout,
    the observation) tokens are unchanged. ``plain_logprobs`` are per-token log pi_old(y | h), a [rows, T] tensor
    aligned with ``rows.completion_ids``. With ``action_only``, turns whose action span is
    empty are left out (not scorable); non-finite values are kept so the scorer can reject them.
    """
    keep = rescored_rows(rows, pi_texts)
    pairs = []
    for r in keep:
        traj = rows.row_trajectory[r]
        first_turn = next(t for t in rows.token_turn[r] if t != NOT_POLICY)  # exists: rescored_rows checked it
        pairs.append((privileged_prompt_ids(trajectories[traj], first_turn, pi_texts[traj], chat), rows.completion_ids[r]))
    privileged = score_continuations(pairs, logprob_fn, pad_token_id, min_rows, batch_size)
    shifts_by_row = [privileged[k] - plain_logprobs[r, : len(privileged[k])].float() for k, r in enumerate(keep)]
    per_turn = rows.select(keep).collect(shifts_by_row)
    out = {}
    for (traj, turn), shifts in per_turn.items():
        start, end = trajectories[traj].turns[turn].action_span if action_only else (0, len(shifts))
        if end > start:
            out[(traj, turn)] = shifts[start:end].double()
    return out
