"""Paired rescoring (TASPO Eq. 3): the frozen rollout snapshot scores each sampled response with and without
the privileged context P_i.

The plain pass log pi_old(y | h) is what the trainer already has: the sampling log-probs recorded during
generation (exact for the transformers backend in float32) or TRL's ``old_per_token_logps`` when it computed
them. Only the privileged pass runs here: the same rows with P_i put in front of the row's first user message,
the response tokens unchanged, under no grad, through the trainer's own chunked log-prob function (so LoRA
adapters, DeepSpeed ZeRO-3 and the fused LM head behave exactly as in the loss). Only trajectories that can use
the result (P_i non-empty and A_i != 0) are rescored, so the pass costs at most one forward over the rows.
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


def privileged_rows(rows: Rows, trajectories: Sequence[Trajectory], pi_texts: Sequence[str], chat: ChatFormat) -> tuple[Rows, list[int]]:
    """The rows of trajectories with non-empty PI, with P_i in their prompt. Returns the rows and their indices."""
    keep = [r for r, traj in enumerate(rows.row_trajectory) if traj != NOT_POLICY and pi_texts[traj]]
    sub = rows.select(keep)
    for k, r in enumerate(keep):
        traj = rows.row_trajectory[r]
        first_turn = next(t for t in rows.token_turn[r] if t != NOT_POLICY)
        user_text = trajectories[traj].turns[first_turn].prompt_text
        sub.prompt_ids[k] = chat.first_prompt_ids(privileged_user_text(pi_texts[traj], user_text))
    return sub, keep


def privileged_token_shifts(
    rows: Rows,
    trajectories: Sequence[Trajectory],
    pi_texts: Sequence[str],
    chat: ChatFormat,
    logprob_fn: LogProbFn,
    plain_logprobs: Sequence[Sequence[float]],
    pad_token_id: int,
    min_rows: int = 0,
) -> dict[tuple[int, int], torch.Tensor]:
    """Eq. 3 shifts Delta_itk over each rescored turn's ACTION span, keyed by (trajectory, turn).

    ``plain_logprobs`` are per-token log pi_old(y | h) aligned with ``rows.completion_ids``. Turns whose action
    span is empty are left out (they are not scorable); non-finite values are kept so the scorer can reject them.
    ``min_rows`` pads the pass with empty rows so every process runs the same number of forward passes.
    """
    sub, keep = privileged_rows(rows, trajectories, pi_texts, chat)
    while len(sub) < min_rows:
        sub.append_padding(pad_token_id)
    if len(sub) == 0:
        return {}
    prompts = [torch.tensor(p) for p in sub.prompt_ids]
    completions = [torch.tensor(c) for c in sub.completion_ids]
    width_p, width_c = max(len(p) for p in prompts), max(len(c) for c in completions)
    input_ids = torch.full((len(sub), width_p + width_c), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for k, (p, c) in enumerate(zip(prompts, completions)):
        input_ids[k, width_p - len(p) : width_p] = p
        input_ids[k, width_p : width_p + len(c)] = c
        attention[k, width_p - len(p) : width_p + len(c)] = 1
    with torch.no_grad():
        privileged = logprob_fn(input_ids, attention, width_c).float().cpu()
    shifts_by_row = []
    for k, r in enumerate(keep):
        n = len(sub.completion_ids[k])
        plain = torch.as_tensor(plain_logprobs[r][:n], dtype=torch.float32)
        shifts_by_row.append((privileged[k, :n] - plain).tolist())
    per_turn = sub.select(range(len(keep))).collect(shifts_by_row)
    out = {}
    for (traj, turn), shifts in per_turn.items():
        start, end = trajectories[traj].turns[turn].action_span
        if end > start:
            out[(traj, turn)] = torch.tensor(shifts[start:end], dtype=torch.float64)
    return out
