"""TASPO credit: clipped action scores and positive, bounded, mean-one advantage weights.

Paper: "Reconciling Process Supervision with Outcome-Based Credit in Agentic Policy Optimization", Sec. 3.3-3.4,
Algorithm 1 (App. A.1), App. A.3 and the guarantees of App. B. One small pure function per equation:

    clip_token_shifts       clip(Delta_itk, -c, c)                      (Eq. 4 / A.1, inner term)
    clipped_action_score    d_it, the clipped mean over the action span (Eq. 4 / A.1)
    center_scores           d_hat_it = d_it - mean_{u in I_i} d_iu      (Eq. 4, second line)
    support_scores          q_it = tanh(sign(A_i) d_hat_it / tau)       (Eq. 5)
    mean_one_weights        w_it = 1 + (eps_w / 2)(q_it - mean q)       (Eq. 6)
    taspo_weights           Eqs. 4-6 with the fallbacks of A.3 -> one weight per turn (Eq. 1 constraints)

The reweighted advantage is A~_it = A_i * w_it (Eq. 1), applied to every policy-generated token of turn t
(see ``taspo_trl.credit.normalization.broadcast_turn_values``).

Weights are float64: the guarantees (bounds, trajectory mean exactly one) are checked to ~1e-12 and the
trainer casts them to the advantage dtype when it multiplies. Scores are inputs only, so the precision of the
log-prob shifts (usually float32) does not matter here.

Paper disagreement: Table C.3 lists a token-shift threshold kappa = 0.05, while App. A.3 (the
implementation appendix) says "We apply no small-magnitude filter". ``kappa`` is exposed on the scoring
functions and defaults to ``None`` (off), following A.3. When set, shifts with |Delta| < kappa count as 0 but
still count in the action length |M_it| (the average stays over the complete action). docs/methods.md lists
this and the token-level reconstruction below with the reasons.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .tensors import WEIGHT_DTYPE

__all__ = [
    "FALLBACK_NO_PI",
    "FALLBACK_ZERO_ADVANTAGE",
    "FALLBACK_FEW_SCORABLE",
    "FALLBACK_REASONS",
    "WEIGHT_DTYPE",
    "clip_token_shifts",
    "clipped_action_score",
    "center_scores",
    "support_scores",
    "mean_one_weights",
    "taspo_fallback_reason",
    "taspo_weights",
    "taspo_token_fallback_reason",
    "taspo_token_weights",
]

# Fallback reasons, in the order they are checked (Algorithm 1, line 10 then line 13).
FALLBACK_NO_PI = "no_pi"  # the aligned privileged context P_i is empty
FALLBACK_ZERO_ADVANTAGE = "zero_advantage"  # A_i == 0: sign(A_i) undefined and nothing to redistribute
FALLBACK_FEW_SCORABLE = "few_scorable"  # |I_i| < 2: no relative comparison possible
FALLBACK_REASONS = (FALLBACK_NO_PI, FALLBACK_ZERO_ADVANTAGE, FALLBACK_FEW_SCORABLE)

ShiftsLike = torch.Tensor | Sequence[float]
ScoreLike = float | None


# --------------------------------------------------------------------------------------------------------------
# argument checks


def _check_c_delta(c_delta: float) -> None:
    if not (math.isfinite(c_delta) and c_delta > 0):
        raise ValueError(f"c_delta must be a finite number > 0, got {c_delta!r}")


def _check_kappa(kappa: float | None) -> None:
    if kappa is not None and not (math.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"kappa must be None (no filter) or a finite number >= 0, got {kappa!r}")


def _check_tau_eps(tau: float, eps_w: float) -> None:
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    if not (0 <= eps_w < 1):
        # eps_w >= 1 would allow w = 0 or negative weights, flipping or erasing the advantage sign (Eq. 1).
        raise ValueError(f"eps_w must satisfy 0 <= eps_w < 1, got {eps_w!r}")


def _advantage_value(advantage: float | torch.Tensor) -> float:
    value = float(advantage.item() if isinstance(advantage, torch.Tensor) else advantage)
    if not math.isfinite(value):
        raise ValueError(f"advantage must be finite, got {value!r}")
    return value


def _as_shift_tensor(token_shifts: ShiftsLike) -> torch.Tensor:
    shifts = torch.as_tensor(token_shifts, dtype=WEIGHT_DTYPE)
    if shifts.dim() != 1:
        raise ValueError(f"token_shifts must be 1-D (one action span), got shape {tuple(shifts.shape)}")
    return shifts


def _span_is_scorable(shifts: torch.Tensor) -> bool:
    # A.3: a turn enters I_i only with a complete nonempty span whose every shift is finite; partial spans
    # would be compared against complete ones otherwise.
    return shifts.numel() > 0 and bool(torch.isfinite(shifts).all())


def _score_is_usable(score: ScoreLike) -> bool:
    return score is not None and math.isfinite(float(score))


def _score_list(action_scores: Sequence[ScoreLike] | torch.Tensor) -> list[ScoreLike]:
    # A tensor marks unscorable turns with NaN, a sequence with None; both end up as "not usable".
    if isinstance(action_scores, torch.Tensor):
        if action_scores.dim() != 1:
            raise ValueError(f"action_scores must be 1-D, got shape {tuple(action_scores.shape)}")
        return [float(s) for s in action_scores.tolist()]
    return list(action_scores)


# --------------------------------------------------------------------------------------------------------------
# Eq. 4 / A.1: action scores


def clip_token_shifts(token_shifts: ShiftsLike, c_delta: float = 2.0, kappa: float | None = None) -> torch.Tensor:
    """Per-token clipped shifts clip(Delta_itk, -c_Delta, c_Delta) (Eq. 4 / A.1, the summand).

    ``kappa`` (default off) zeroes shifts with |Delta| < kappa first (Table C.3; A.3 says no filter).
    Non-finite entries pass through unchanged so callers can still detect them. Returns float64.
    """
    _check_c_delta(c_delta)
    _check_kappa(kappa)
    shifts = _as_shift_tensor(token_shifts)
    if kappa is not None and kappa > 0:
        shifts = torch.where(shifts.abs() < kappa, torch.zeros_like(shifts), shifts)
    # torch.clamp maps +-inf to +-c, which would hide an invalid span, so keep non-finite values as they are.
    clipped = shifts.clamp(-c_delta, c_delta)
    return torch.where(torch.isfinite(shifts), clipped, shifts)


def clipped_action_score(
    token_shifts: ShiftsLike, c_delta: float = 2.0, kappa: float | None = None
) -> float | None:
    """Action score d_it = mean_k clip(Delta_itk, -c_Delta, c_Delta) over the action tokens M_it (Eq. 4 / A.1).

    Args:
        token_shifts: the PI-induced log-prob shifts Delta_itk (Eq. 3) of the action-span tokens, as a 1-D tensor
            or a sequence of floats.
        c_delta: clipping threshold c_Delta > 0 (paper default 2.0). Guarantees |d| <= c (B.5) and that one token
            moves d by at most 2c/|M_it| (B.6).
        kappa: optional small-magnitude filter (Table C.3); ``None`` (default) = off, as App. A.3 specifies.

    Returns:
        ``d_it`` as a Python float, or ``None`` when the turn is not scorable (empty span, or any non-finite
        shift), in which case the turn stays out of I_i and keeps weight 1.
    """
    clipped = clip_token_shifts(token_shifts, c_delta=c_delta, kappa=kappa)
    if not _span_is_scorable(clipped):
        return None
    return float(clipped.mean())


# --------------------------------------------------------------------------------------------------------------
# Eqs. 4-6 on the scorable set I_i (pure tensor functions; inputs are the scores of I_i only)


def center_scores(scores: torch.Tensor) -> torch.Tensor:
    """Trajectory-relative support d_hat_it = d_it - mean_{u in I_i} d_iu (Eq. 4, second line).

    ``scores`` holds d_it for t in I_i only. Adding the same constant to all of them leaves the result
    unchanged (shared-shift invariance, App. B.2).
    """
    scores = scores.to(WEIGHT_DTYPE)
    return scores - scores.mean()


def support_scores(centered: torch.Tensor, advantage: float, tau: float = 0.5) -> torch.Tensor:
    """Signed, squashed support q_it = tanh(sign(A_i) d_hat_it / tau) (Eq. 5), for A_i != 0.

    The sign flip makes better-supported actions get *less negative* credit on a failed trajectory instead of
    more (larger w on A_i < 0 would penalise them harder). tanh bounds q in [-1, 1], which is what gives
    |w - 1| <= eps_w in Eq. 6.
    """
    a = _advantage_value(advantage)
    if a == 0:
        raise ValueError("Eq. 5 is undefined for A_i == 0; use taspo_weights, which falls back to unit weights")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    sign = 1.0 if a > 0 else -1.0
    return torch.tanh(sign * centered.to(WEIGHT_DTYPE) / tau)


def mean_one_weights(q: torch.Tensor, eps_w: float = 0.4) -> torch.Tensor:
    """Weights w_it = 1 + eta (q_it - mean_{u in I_i} q_iu), eta = eps_w / 2 (Eq. 6; closed form B.2).

    The second centering is needed because tanh does not keep the zero mean of d_hat; it makes the weights
    average exactly one over I_i, and q in [-1, 1] gives 1 - eps_w <= w <= 1 + eps_w (B.3).
    """
    if not (0 <= eps_w < 1):
        raise ValueError(f"eps_w must satisfy 0 <= eps_w < 1, got {eps_w!r}")
    q = q.to(WEIGHT_DTYPE)
    return 1.0 + (eps_w / 2.0) * (q - q.mean())


def _redistribute(scores: torch.Tensor, advantage: float, tau: float, eps_w: float) -> torch.Tensor:
    return mean_one_weights(support_scores(center_scores(scores), advantage, tau), eps_w)


# --------------------------------------------------------------------------------------------------------------
# action-level allocation (the paper's method)


def taspo_fallback_reason(
    action_scores: Sequence[ScoreLike] | torch.Tensor,
    advantage: float | torch.Tensor,
    has_pi: bool = True,
) -> str | None:
    """Why ``taspo_weights`` leaves every weight at one, or ``None`` when it redistributes (A.3; Alg. 1 l. 10, 13).

    Checked in order: ``"no_pi"`` (empty aligned PI), ``"zero_advantage"`` (A_i == 0), ``"few_scorable"``
    (fewer than two scorable turns). ``action_scores`` uses ``None`` (or NaN in a tensor) for unscorable turns.
    """
    if not has_pi:
        return FALLBACK_NO_PI
    if _advantage_value(advantage) == 0:
        return FALLBACK_ZERO_ADVANTAGE
    if sum(_score_is_usable(s) for s in _score_list(action_scores)) < 2:
        return FALLBACK_FEW_SCORABLE
    return None


def taspo_weights(
    action_scores: Sequence[ScoreLike] | torch.Tensor,
    advantage: float | torch.Tensor,
    tau: float = 0.5,
    eps_w: float = 0.4,
    *,
    has_pi: bool = True,
) -> torch.Tensor:
    """Per-turn TASPO weights w_it for one trajectory (Eqs. 4-6 with the fallbacks of App. A.3).

    Args:
        action_scores: one entry per turn t = 1..T_i: the clipped action score d_it from
            ``clipped_action_score``, or ``None`` (NaN in a tensor) when the turn is unscorable.
        advantage: the trajectory's outcome advantage A_i (e.g. from ``grpo_outcome_advantages``).
        tau: score temperature tau > 0 (paper default 0.5).
        eps_w: weight range 0 <= eps_w < 1 (paper default 0.4).
        has_pi: whether the aligned privileged context P_i is nonempty; ``False`` falls back to GRPO.

    Returns:
        float64 tensor of shape (T_i,). Scorable turns get Eq. 6 weights centred within I_i; unscorable turns
        get 1; everything is 1 when ``taspo_fallback_reason`` is not ``None``. In all cases
        1 - eps_w <= w <= 1 + eps_w, w > 0 and mean_t w_it = 1 over the whole trajectory (Eq. 1, B.3).

    Raises:
        ValueError: tau <= 0, eps_w outside [0, 1), or a non-finite advantage.
    """
    _check_tau_eps(tau, eps_w)
    scores = _score_list(action_scores)
    weights = torch.ones(len(scores), dtype=WEIGHT_DTYPE)
    if taspo_fallback_reason(scores, advantage, has_pi) is not None:
        return weights
    scorable = [t for t, s in enumerate(scores) if _score_is_usable(s)]
    d = torch.tensor([float(scores[t]) for t in scorable], dtype=WEIGHT_DTYPE)
    weights[scorable] = _redistribute(d, _advantage_value(advantage), tau, eps_w)
    return weights


# --------------------------------------------------------------------------------------------------------------
# token-level allocation (Table 4 ablation, allocation_unit="token")
#
# The paper gives no formula for its token-level ablation (docs/methods.md). This package's reconstruction is
# the direct analogue of Eqs. 4-6 with the token as the unit instead of the action:
#   * the scored tokens are the action tokens of scorable turns (same turn-level validity check as A.3, so both
#     allocation units see the same I_i);
#   * each scored token's score is its own clipped shift clip(Delta_itk, -c, c) (no averaging over the span);
#   * scores are centred over all scored tokens of the trajectory, squashed with tanh(sign(A) . / tau), and
#     centred again, giving w_itk = 1 + (eps_w/2)(q_itk - mean q) on scored tokens;
#   * every other token (reasoning tokens, tokens of unscorable turns) keeps weight 1;
#   * fallback: no PI, A_i == 0, or fewer than two scored tokens.
# Hence the uniform mean of the weights over the scored tokens (and over all policy tokens) is 1 and the same
# bounds, positivity, sign preservation and monotonicity hold per token. Caveat: under Eq. 7 every turn gets
# equal total mass, so tokens in short turns weigh more than tokens in long turns and the Eq. 7-weighted mean of
# A~ equals A_i only up to that reweighting (it is exact at the action level, where a turn shares one weight).


def taspo_token_fallback_reason(
    token_shifts_per_turn: Sequence[ShiftsLike | None],
    advantage: float | torch.Tensor,
    has_pi: bool = True,
) -> str | None:
    """Fallback reason for ``taspo_token_weights`` (same codes as ``taspo_fallback_reason``).

    ``"few_scorable"`` here means fewer than two scored *tokens* (action tokens of scorable turns).
    """
    if not has_pi:
        return FALLBACK_NO_PI
    if _advantage_value(advantage) == 0:
        return FALLBACK_ZERO_ADVANTAGE
    n_scored = 0
    for shifts in token_shifts_per_turn:
        if shifts is None:
            continue
        shifts_t = _as_shift_tensor(shifts)
        if _span_is_scorable(shifts_t):
            n_scored += shifts_t.numel()
    if n_scored < 2:
        return FALLBACK_FEW_SCORABLE
    return None


def taspo_token_weights(
    token_shifts_per_turn: Sequence[ShiftsLike | None],
    advantage: float | torch.Tensor,
    c_delta: float = 2.0,
    tau: float = 0.5,
    eps_w: float = 0.4,
    kappa: float | None = None,
    *,
    has_pi: bool = True,
) -> list[torch.Tensor]:
    """Token-level TASPO weights for the allocation-unit ablation (Table 4); this package's reconstruction.

    Args:
        token_shifts_per_turn: per turn, the shifts Delta_itk of its action-span tokens (1-D tensor or floats),
            or ``None`` when the turn has no scoring inputs.
        advantage, tau, eps_w, has_pi: as in ``taspo_weights``.
        c_delta, kappa: as in ``clipped_action_score``.

    Returns:
        One float64 tensor per turn with one weight per action-span token (same length as that turn's shifts;
        empty for a ``None`` turn). Unscorable turns get all ones. Policy tokens outside the action span are not
        scored and keep weight 1 (the caller fills them). See the module notes for the exact rule.
    """
    _check_c_delta(c_delta)
    _check_kappa(kappa)
    _check_tau_eps(tau, eps_w)
    clipped = [
        torch.ones(0, dtype=WEIGHT_DTYPE)
        if s is None
        else clip_token_shifts(s, c_delta=c_delta, kappa=kappa)
        for s in token_shifts_per_turn
    ]
    weights = [torch.ones_like(c) for c in clipped]
    if taspo_token_fallback_reason(token_shifts_per_turn, advantage, has_pi) is not None:
        return weights
    scored_turns = [
        t for t, (s, c) in enumerate(zip(token_shifts_per_turn, clipped)) if s is not None and _span_is_scorable(c)
    ]
    flat = torch.cat([clipped[t] for t in scored_turns])
    flat_w = _redistribute(flat, _advantage_value(advantage), tau, eps_w)
    for t, w in zip(scored_turns, torch.split(flat_w, [clipped[t].numel() for t in scored_turns])):
        weights[t] = w.clone()
    return weights
