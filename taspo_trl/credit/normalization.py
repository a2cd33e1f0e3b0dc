"""Turn-balanced loss normalisation (TASPO paper, Eq. 7 and App. A.3).

Eq. 7 averages the token losses within each turn, then over the T_i turns of a trajectory, then over the B
trajectories:

    L = (1/B) sum_i (1/T_i) sum_t (1/|R_it|) sum_{k in R_it} l_itk.

Equivalently every policy token of turn t of trajectory i carries the weight 1/(T_i |R_it|), the weights of one
trajectory sum to 1, and L = sum(l * weight) / B. The trainer feeds these weights to TRL as a fractional token
mask; TRL's "dapo" loss divides by the sum of the mask, which is then exactly B, so TRL computes Eq. 7.

Conventions:
    * |R_it| counts policy-generated tokens (reasoning and action; no observations, no padding).
    * A turn with no policy token (e.g. an empty or fully truncated response) contributes nothing and is not
      counted in T_i. TASPO's mean-one weights are defined over turns, so such a turn's weight has no effect.
    * A trajectory with no policy token at all gets zero weights; whether it counts in B is the caller's choice.
    * The balancing applies in every fallback case too: it is independent of the credit weights (A.3).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "turn_balanced_token_weights",
    "turn_balanced_token_mask",
    "broadcast_turn_values",
    "turn_row_scales",
    "turn_balanced_loss",
]


def _check_counts(turn_token_counts: Sequence[int]) -> list[int]:
    counts = [int(c) for c in turn_token_counts]
    if any(c < 0 for c in counts):
        raise ValueError(f"turn token counts must be >= 0, got {counts}")
    return counts


def turn_balanced_token_weights(turn_token_counts: Sequence[int]) -> list[float]:
    """Per-turn token weight 1/(T_i |R_it|) for one trajectory (Eq. 7).

    Args:
        turn_token_counts: |R_it| for each turn t of the trajectory (policy tokens only).

    Returns:
        One value per turn: the weight each policy token of that turn gets (0.0 for turns with no policy token).
        ``sum(count * value)`` is 1 whenever the trajectory has at least one policy token.
        T_i counts only turns with at least one policy token.
    """
    counts = _check_counts(turn_token_counts)
    n_turns = sum(1 for c in counts if c > 0)
    return [1.0 / (n_turns * c) if c > 0 else 0.0 for c in counts]


def broadcast_turn_values(
    values_per_turn: Sequence[float] | torch.Tensor,
    turn_token_counts: Sequence[int],
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Repeat one value per turn over that turn's policy tokens, in turn order.

    Used for the per-token advantages A~_it = A_i w_it of Algorithm 1, line 20 (``values_per_turn = A_i * w``)
    and for the Eq. 7 token weights. Returns a 1-D tensor of length ``sum(turn_token_counts)``; the caller
    scatters it into the policy-token positions of its row layout.
    """
    counts = _check_counts(turn_token_counts)
    values = torch.as_tensor(values_per_turn, dtype=dtype).reshape(-1)
    if values.numel() != len(counts):
        raise ValueError(f"got {values.numel()} values for {len(counts)} turns")
    return torch.repeat_interleave(values, torch.tensor(counts, dtype=torch.long))


def turn_balanced_token_mask(turn_token_counts: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Eq. 7 weights as a flat per-token tensor for one trajectory (sums to 1; the fractional loss mask)."""
    return broadcast_turn_values(turn_balanced_token_weights(turn_token_counts), turn_token_counts, dtype=dtype)


def turn_row_scales(row_turn_counts: Sequence[int | None], num_trajectories: int) -> list[float]:
    """Row factors N_row / (N_traj T_i) for the one-row-per-turn layout with row-averaged losses (App. A.3).

    When each row holds one turn and the loss is the mean over rows of each row's token-averaged term,
    multiplying row r's term by N_row / (N_traj T_i(r)) turns that mean into Eq. 7.

    Args:
        row_turn_counts: for each row, T_i of the trajectory the row's turn belongs to, or ``None`` for a
            padding row (factor 0). N_row is ``len(row_turn_counts)``, padding included.
        num_trajectories: N_traj, the number of real trajectories.
    """
    if num_trajectories <= 0:
        raise ValueError(f"num_trajectories must be > 0, got {num_trajectories}")
    n_rows = len(row_turn_counts)
    scales = []
    for t_i in row_turn_counts:
        if t_i is None:
            scales.append(0.0)
        elif t_i <= 0:
            raise ValueError(f"a real row needs T_i >= 1, got {t_i}")
        else:
            scales.append(n_rows / (num_trajectories * t_i))
    return scales


def turn_balanced_loss(
    per_token_loss: torch.Tensor, token_weights: torch.Tensor, num_trajectories: int
) -> torch.Tensor:
    """Eq. 7 from per-token losses and turn-balanced weights: sum(l * weight) / N_traj.

    The reference the trainer's TRL-side loss must agree with; ``token_weights`` is zero on observations and
    padding and 1/(T_i |R_it|) on policy tokens (see ``turn_balanced_token_mask``).
    """
    if num_trajectories <= 0:
        raise ValueError(f"num_trajectories must be > 0, got {num_trajectories}")
    if per_token_loss.shape != token_weights.shape:
        raise ValueError(f"shape mismatch: {tuple(per_token_loss.shape)} vs {tuple(token_weights.shape)}")
    return (per_token_loss * token_weights).sum() / num_trajectories
