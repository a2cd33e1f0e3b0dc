"""Advantage shaping of the comparison methods: RLSD, OPID, GiGPO and StepOPSD.

Every method starts from GRPO's outcome advantage A (``taspo_trl.credit.grpo``) and reshapes it per token or per
step; the README's "Comparison methods" section says what each method is. One small pure function per equation, verl
``core_algos.py`` style. Conventions shared by the token-level transforms:

    * inputs are [rows, T] tensors over the response tokens of per-turn rows (TRL's ``completion_mask`` layout);
      ``advantages`` may also be [rows] (one A per row, broadcast over its tokens);
    * ``delta`` is the teacher-student gap on the sampled token, Delta_t = log pi_T(y_t | privileged context)
      - log pi_theta(y_t | plain context), computed by the rescoring machinery (``taspo_trl.privileged.rescoring``);
      it is always detached here (sg), so advantages never carry gradient;
    * outputs are [rows, T] in the floating dtype of ``advantages`` and exactly 0 outside ``mask``, so padding,
      observations and non-finite gaps there never leak into the loss.

Method index:

    rlsd_lambda, rlsd_advantages       RLSD (Yang et al., 2604.03128) A_hat = A ((1-lam) + lam clip(exp(sign(A) Delta)))
    opid_advantages                    OPID (Yang, Wu et al., 2606.26790): A' = A + w_e Delta_episode + w_s Delta_step
    discounted_returns                 GiGPO Eq. 5 (Feng et al., 2505.10978): R_t = sum_k gamma^k r_{t+k}
    anchor_state_groups                GiGPO Eq. 6: steps with an identical observation in one task group
    gigpo_step_advantages              GiGPO Eq. 7: R_t normalised within its anchor-state group
    gigpo_advantages                   GiGPO Eq. 8: A = A_E + omega A_S
    stepopsd_advantages                StepOPSD (Zhang et al., 2605.27140): APPROXIMATION, see its docstring
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from .alignopsd import alignopsd_weights, turn_evidence

__all__ = [
    "GIGPO_NORMS",
    "rlsd_lambda",
    "rlsd_advantages",
    "opid_advantages",
    "discounted_returns",
    "anchor_state_groups",
    "gigpo_step_advantages",
    "gigpo_advantages",
    "stepopsd_advantages",
]

# "mean": A_S = R - mean (verl-agent's default mode "mean_norm"); "mean_std": (R - mean) / (std + eps)
# (verl-agent's "mean_std_norm"; the paper's F_norm = std).
GIGPO_NORMS = ("mean", "mean_std")


# --------------------------------------------------------------------------------------------------------------
# argument helpers


def _token_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[rows] or [rows, T] advantages as a floating [rows, T] tensor (checked against the mask's shape)."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [rows, T], got shape {tuple(mask.shape)}")
    adv = advantages.detach()
    if not adv.is_floating_point():
        adv = adv.to(torch.float32)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand(mask.shape)
    if adv.shape != mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} do not match mask {tuple(mask.shape)}")
    return adv


def _masked_gap(delta: torch.Tensor, mask: torch.Tensor, name: str) -> torch.Tensor:
    """sg(delta) with 0 outside the mask (a NaN gap on padding must not turn the row's advantages into NaN)."""
    if delta.shape != mask.shape:
        raise ValueError(f"{name} {tuple(delta.shape)} does not match mask {tuple(mask.shape)}")
    gap = delta.detach()
    keep = mask.bool()
    if not bool(torch.isfinite(gap[keep]).all()):
        raise ValueError(f"{name} must be finite on masked (optimised) tokens")
    return torch.where(keep, gap, torch.zeros_like(gap))


# --------------------------------------------------------------------------------------------------------------
# RLSD (Yang et al., 2604.03128)


def rlsd_lambda(step: int, lam0: float = 0.5, decay_steps: int = 50) -> float:
    """RLSD's mixing weight, linearly decayed: lam(step) = lam0 max(0, 1 - step / decay_steps).

    lam0 = 0.5 at step 0 and 0 from ``decay_steps`` (50) on, after which RLSD is plain GRPO.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    if not 0.0 <= lam0 <= 1.0:
        raise ValueError(f"lam0 must be in [0, 1], got {lam0!r}")
    if decay_steps <= 0:
        raise ValueError(f"decay_steps must be > 0, got {decay_steps!r}")
    return lam0 * max(0.0, 1.0 - step / decay_steps)


def rlsd_advantages(
    advantages: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor, lam: float, clip_eps: float = 0.2
) -> torch.Tensor:
    """RLSD token advantages A_hat_t = A ((1 - lam) + lam clip(exp(sign(A) sg(Delta_t)), 1 - eps, 1 + eps)).

    "The reward sets the direction, the teacher the size": the factor lies in [(1 - lam) + lam (1 - eps),
    (1 - lam) + lam (1 + eps)], which is > 0 for lam in [0, 1] and eps in [0, 1), so A_hat never flips the sign of A.
    The sign(A) inside the exponent makes a teacher-endorsed token (Delta > 0) get MORE credit on a success and
    LESS blame on a failure. A = 0 stays 0; lam = 0 returns A exactly (GRPO).

    Args:
        advantages: A, [rows] (one per row) or [rows, T].
        delta: Delta_t, [rows, T] (detached here).
        mask: completion mask, [rows, T].
        lam: lambda in [0, 1] (``rlsd_lambda`` gives the paper's schedule).
        clip_eps: eps in [0, 1) (paper 0.2).

    Returns:
        [rows, T] advantages, 0 outside the mask.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    if not 0.0 <= clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in [0, 1), got {clip_eps!r}")
    adv = _token_advantages(advantages, mask)
    gap = _masked_gap(delta, mask, "delta").to(adv.dtype)
    ratio = torch.exp(torch.sign(adv) * gap).clamp(1.0 - clip_eps, 1.0 + clip_eps)
    shaped = adv * ((1.0 - lam) + lam * ratio)
    return torch.where(mask.bool(), shaped, torch.zeros_like(shaped))


# --------------------------------------------------------------------------------------------------------------
# OPID (Yang, Wu et al., 2606.26790)


def opid_advantages(
    advantages: torch.Tensor,
    delta_episode: torch.Tensor,
    delta_step: torch.Tensor | None,
    mask: torch.Tensor,
    w_episode: float = 0.001,
    w_step: float = 0.001,
) -> torch.Tensor:
    """OPID token advantages A'_t = A + w_e sg(Delta_episode_t) + w_s sg(Delta_step_t) (per token, not summed).

    Delta_episode_t is the gap of token t when the OLD policy rescores the same response with the trajectory's
    episode skill inserted, Delta_step_t the gap with the skill of the step the token belongs to. Both are used per
    token, as its specification states; the gaps are not summed or averaged over a turn. Unlike RLSD this is additive,
    so a large gap can flip the sign of a small A (the paper's 0.001 weights keep that rare).

    Args:
        advantages: A, [rows] or [rows, T].
        delta_episode: [rows, T].
        delta_step: [rows, T], or None when no step skill exists (turns without a step skill: put 0 there; OPID
            writes at most 5 step skills per trajectory).
        mask: completion mask, [rows, T].
        w_episode, w_step: the weights (0.001 on ALFWorld). Both 0 returns A exactly (GRPO).

    Returns:
        [rows, T] advantages, 0 outside the mask.
    """
    adv = _token_advantages(advantages, mask)
    shaped = adv + w_episode * _masked_gap(delta_episode, mask, "delta_episode").to(adv.dtype)
    if delta_step is not None:
        shaped = shaped + w_step * _masked_gap(delta_step, mask, "delta_step").to(adv.dtype)
    return torch.where(mask.bool(), shaped, torch.zeros_like(shaped))


# --------------------------------------------------------------------------------------------------------------
# GiGPO (Feng et al., 2505.10978; verl-agent ``gigpo/core_gigpo.py``)


def discounted_returns(rewards: Sequence[float], gamma: float = 0.95) -> list[float]:
    """Discounted return of every step of one trajectory, R_t = sum_k gamma^k r_{t+k} (GiGPO Eq. 5)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    returns = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


def anchor_state_groups(observations: Sequence[Sequence[str]], group_ids: Sequence[Hashable]) -> list[list[int]]:
    """Anchor-state group label of every step (GiGPO Eq. 6): equal labels = same task group AND identical text.

    Observations are compared as exact strings (verl-agent's default; its optional fuzzy matching is not
    reproduced). As in verl-agent, every step of the task group takes part, so a trajectory that revisits a state
    puts both visits in one group. Labels are consecutive ints in order of first appearance.

    Args:
        observations: per trajectory, the observation text each step acted on (the state s_t before action a_t).
        group_ids: per trajectory, its task group (the GRPO group; siblings share it).
    """
    if len(observations) != len(group_ids):
        raise ValueError(f"{len(observations)} trajectories but {len(group_ids)} group ids")
    labels: dict[tuple[Hashable, str], int] = {}
    out: list[list[int]] = []
    for obs, gid in zip(observations, group_ids, strict=True):
        out.append([labels.setdefault((gid, str(o)), len(labels)) for o in obs])
    return out


def gigpo_step_advantages(
    observations: Sequence[Sequence[str]],
    step_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    gamma: float = 0.95,
    norm: str = "mean",
    eps: float = 1e-6,
) -> list[torch.Tensor]:
    """Step-relative advantages A_S (GiGPO Eq. 7): discounted returns normalised within anchor-state groups.

    A_S(s, a) = (R - mean_G) / F_norm over the anchor group G of the step. ``norm="mean"`` (default, verl-agent's
    "mean_norm") takes F_norm = 1; ``norm="mean_std"`` takes F_norm = std_G + eps with the unbiased std, and std
    1 for a one-member group (both as in verl-agent). A step whose state no other step of its task group shares
    is its own group, so its A_S is exactly 0.

    Args:
        observations: per trajectory, one observation string per step.
        step_rewards: per trajectory, the reward after each step (ALFWorld: 0 ... 0, then 10 on success in
            verl-agent; any scale works).
        group_ids: per trajectory, its task group.
        gamma: discount (paper 0.95).
        norm: one of ``GIGPO_NORMS``.
        eps: std stabiliser for ``norm="mean_std"``.

    Returns:
        One float64 tensor per trajectory with one A_S per step.
    """
    if norm not in GIGPO_NORMS:
        raise ValueError(f"norm must be one of {GIGPO_NORMS}, got {norm!r}")
    if len(step_rewards) != len(observations):
        raise ValueError(f"{len(observations)} observation lists but {len(step_rewards)} reward lists")
    for i, (obs, rew) in enumerate(zip(observations, step_rewards, strict=True)):
        if len(obs) != len(rew):
            raise ValueError(f"trajectory {i}: {len(obs)} observations but {len(rew)} rewards")
    returns = [discounted_returns(r, gamma) for r in step_rewards]
    labels = anchor_state_groups(observations, group_ids)
    members: dict[int, list[float]] = defaultdict(list)
    for traj_labels, traj_returns in zip(labels, returns, strict=True):
        for label, ret in zip(traj_labels, traj_returns, strict=True):
            members[label].append(ret)
    stats: dict[int, tuple[float, float]] = {}
    for label, values in members.items():
        group = torch.tensor(values, dtype=torch.float64)
        std = float(group.std()) if group.numel() > 1 else 1.0
        stats[label] = (float(group.mean()), std)
    out = []
    for traj_labels, traj_returns in zip(labels, returns, strict=True):
        adv = []
        for label, ret in zip(traj_labels, traj_returns, strict=True):
            mean, std = stats[label]
            adv.append(ret - mean if norm == "mean" else (ret - mean) / (std + eps))
        out.append(torch.tensor(adv, dtype=torch.float64))
    return out


def gigpo_advantages(
    episode_advantages: torch.Tensor | Sequence[float],
    observations: Sequence[Sequence[str]],
    step_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    omega: float = 1.0,
    gamma: float = 0.95,
    norm: str = "mean",
    eps: float = 1e-6,
) -> list[torch.Tensor]:
    """GiGPO per-step advantages A = A_E + omega A_S (GiGPO Eq. 8), one tensor per trajectory.

    A_E is taken as an input (one value per trajectory): pass GRPO's ``grpo_outcome_advantages`` so that
    omega = 0 is exactly the GRPO baseline (verl-agent computes its own episode normalisation with eps 1e-6 and,
    in its default mode, no std scaling; with the trainer's GRPO advantages the two methods differ only by A_S).
    The caller broadcasts each step's value over that step's response tokens (``broadcast_turn_values``).

    Args:
        episode_advantages: A_E per trajectory, [N].
        observations, step_rewards, group_ids, gamma, norm, eps: as in ``gigpo_step_advantages``.
        omega: step-advantage weight (paper 1.0).

    Returns:
        One float64 tensor per trajectory with one advantage per step.
    """
    a_e = torch.as_tensor(episode_advantages, dtype=torch.float64).detach()
    if a_e.dim() != 1 or a_e.numel() != len(observations):
        raise ValueError(f"episode_advantages must be [{len(observations)}], got shape {tuple(a_e.shape)}")
    steps = gigpo_step_advantages(observations, step_rewards, group_ids, gamma=gamma, norm=norm, eps=eps)
    return [a_e[i] + omega * a_s for i, a_s in enumerate(steps)]


# --------------------------------------------------------------------------------------------------------------
# StepOPSD (Zhang et al., 2605.27140): APPROXIMATION


def stepopsd_advantages(
    advantage: float | torch.Tensor,
    delta: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    eps: float = 0.5,
) -> torch.Tensor:
    """StepOPSD token advantages for ONE trajectory. APPROXIMATION: the paper's exact formula is not public
    (docs/methods.md).

    What the method's specification states is reproduced: each step segment is rescored under a hindsight teacher, and the token
    gaps become sign-preserving advantage shaping under a per-step credit budget. This package's construction
    (reusing AlignOPSD's allocation, ``taspo_trl.credit.alignopsd``, with the whole trajectory as one span):

        e_s   = sign(A) * mean over step s's masked tokens of sg(Delta_t)            (``turn_evidence``)
        b_s   = n_s exp(e_s / temp) / sum_u n_u exp(e_u / temp)                      (the step's credit budget)
        w_s   = b_s N / n_s, then clip to [1 - eps, 1 + eps] and rescale exactly so sum_s n_s w_s = N
                                                                                     (``bounded_normalize``)
        A_t   = A w_s for every masked token t of step s

    n_s is step s's number of masked tokens and N their sum. Hence w_s > 0 (A_t keeps the sign of A), and the
    token-weighted mean of A_t over the trajectory is exactly A. On a failure (A < 0) the sign(A) makes the step
    the teacher endorses (e_s < 0) take less of the blame. All-equal gaps, A = 0 or eps = 0 give GRPO exactly.

    Args:
        advantage: the trajectory's A (scalar).
        delta: [S, T] hindsight-teacher gaps, one row per step (the per-turn row layout).
        mask: [S, T] completion mask of those rows.
        temperature: budget temperature > 0 (``inf`` = uniform budget = GRPO).
        eps: weight bound in [0, 1).

    Returns:
        [S, T] float64 advantages, 0 outside the mask.
    """
    a = float(advantage.item() if isinstance(advantage, torch.Tensor) else advantage)
    if not math.isfinite(a):
        raise ValueError(f"advantage must be finite, got {a!r}")
    keep = mask.bool()
    gap = _masked_gap(delta, mask, "delta").to(torch.float64)
    if gap.shape[0] == 0:
        return gap
    counts = keep.sum(dim=-1).tolist()
    evidence = [turn_evidence(gap[s], a, keep[s]) for s in range(gap.shape[0])]
    weights = alignopsd_weights(evidence, counts, [(0, len(counts))], temperature=temperature, eps=eps)
    shaped = a * weights.unsqueeze(-1).expand(gap.shape)
    return torch.where(keep, shaped, torch.zeros_like(shaped))
