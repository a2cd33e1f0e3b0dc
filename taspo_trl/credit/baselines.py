"""Advantage shaping of the comparison methods: RLSD, OPID, GiGPO and StepOPSD.

RLSD, OPID and StepOPSD start from GRPO's outcome advantage A (``taspo_trl.credit.grpo``) and reshape it per token
or per step; GiGPO computes its own episode and step advantages. docs/credit-methods.md ("Comparison methods") says what
each method is; docs/baselines_vs_official.md compares each with its official code. One small pure function per
equation, verl ``core_algos.py`` style. Conventions shared by the token-level transforms:

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
    anchor_state_groups                GiGPO Eq. 6: steps with the same (or a similar) observation in one task group
    gigpo_episode_advantages           GiGPO Eq. 3: episode score normalised over the group's step rows
    gigpo_step_advantages              GiGPO Eq. 7: R_t normalised within its anchor-state group
    gigpo_advantages                   GiGPO Eq. 8: A = A_E + omega A_S
    stepopsd_advantages                StepOPSD (Zhang et al., 2605.27140): APPROXIMATION, see its docstring
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher

import torch

from .stepopsd import gibbs_weights, turn_evidence

__all__ = [
    "GIGPO_NORMS",
    "rlsd_lambda",
    "rlsd_advantages",
    "opid_advantages",
    "discounted_returns",
    "anchor_state_groups",
    "gigpo_episode_advantages",
    "gigpo_step_advantages",
    "gigpo_advantages",
    "stepopsd_advantages",
]

# "mean": A = x - mean (verl-agent's mode "mean_norm", its config default and WebShop launcher's); "mean_std":
# (x - mean) / (std + eps) (verl-agent's "mean_std_norm", its ALFWorld and Search launchers'; the paper's F_norm = std).
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
    """RLSD's mixing weight at optimizer step ``step``, linearly decayed as the official trainer decays it:
    lam = lam0 max(0, 1 - (step + 1) / decay_steps).

    ``RLSDRayTrainer._get_rlsd_lambda`` (SDAR's and Align-OPSD's ``verl/trainer/ppo/rlsd_ray_trainer.py``) takes
    verl's ``global_steps``, which is 1 during the first update; ``step`` here is TRL's ``state.global_step``, the
    number of updates already made (0 during the first). So the first update uses lam0 (1 - 1 / decay_steps)
    (0.49 for the defaults), the last non-zero one is step ``decay_steps - 2``, and from step ``decay_steps - 1``
    on (the official step ``decay_steps``) RLSD is plain GRPO. Defaults: the official code's (0.5 over 50 steps;
    SDAR's RLSD launchers set ``warmdown_steps=100``).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    if not 0.0 <= lam0 <= 1.0:
        raise ValueError(f"lam0 must be in [0, 1], got {lam0!r}")
    if decay_steps <= 0:
        raise ValueError(f"decay_steps must be > 0, got {decay_steps!r}")
    return lam0 * max(0.0, 1.0 - (step + 1) / decay_steps)


def rlsd_advantages(
    advantages: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor, lam: float, clip_eps: float = 0.2
) -> torch.Tensor:
    """RLSD token advantages A_hat_t = A ((1 - lam) + lam clip(exp(sign(A) sg(Delta_t)), 1 - eps, 1 + eps)), the
    formula of the official ``compute_rlsd_token_advantage`` (SDAR's ``verl/trainer/ppo/rlsd_utils.py``).

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
# GiGPO (Feng et al., 2505.10978), as verl-agent's ``gigpo/core_gigpo.py`` computes it (the copy SDAR's repository
# ships and Align-OPSD's trainer imports)


def discounted_returns(rewards: Sequence[float], gamma: float = 0.95) -> list[float]:
    """Discounted return of every step of one trajectory, R_t = sum_k gamma^k r_{t+k} (GiGPO Eq. 5; verl-agent
    ``compute_step_discounted_returns``)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    returns = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


def anchor_state_groups(
    observations: Sequence[Sequence[str]],
    group_ids: Sequence[Hashable] | torch.Tensor,
    similarity_threshold: float | None = None,
) -> list[list[int]]:
    """Anchor-state group label of every step (GiGPO Eq. 6; verl-agent ``build_step_group``).

    Equal labels = same task group AND the same state. ``similarity_threshold=None`` (verl-agent's default,
    ``enable_similarity: False``) compares the observation texts exactly. A threshold in (0, 1) is verl-agent's
    similarity grouping (its Search launcher uses 0.9): within a task group, steps are visited trajectory by
    trajectory, and each joins the first cluster whose first member's text has a ``difflib.SequenceMatcher`` ratio
    >= the threshold with it, else starts a new cluster. As in verl-agent, every step of the task group takes
    part, so a trajectory that revisits a state puts both visits in one group. Labels are consecutive ints in
    order of first appearance.

    Args:
        observations: per trajectory, the observation text each step acted on (the state s_t before action a_t).
        group_ids: per trajectory, its task group (the GRPO group; siblings share it).
        similarity_threshold: None (exact text) or the SequenceMatcher ratio in (0, 1) that merges two states.
    """
    group_ids = _group_keys(group_ids)
    if len(observations) != len(group_ids):
        raise ValueError(f"{len(observations)} trajectories but {len(group_ids)} group ids")
    if similarity_threshold is not None and not 0.0 < similarity_threshold < 1.0:
        raise ValueError(
            f"similarity_threshold must be in (0, 1) or None (exact matching), got {similarity_threshold!r}"
        )
    labels: dict[tuple[Hashable, str], int] = {}
    clusters: dict[Hashable, list[tuple[str, int]]] = defaultdict(list)  # per task group: (first text, label)
    out: list[list[int]] = []
    for obs, gid in zip(observations, group_ids, strict=True):
        traj_labels = []
        for text in map(str, obs):
            if similarity_threshold is None:
                traj_labels.append(labels.setdefault((gid, text), len(labels)))
                continue
            similar = (
                lab for first, lab in clusters[gid] if SequenceMatcher(None, text, first).ratio() >= similarity_threshold
            )
            label = next(similar, None)
            if label is None:
                label = sum(map(len, clusters.values()))
                clusters[gid].append((text, label))
            traj_labels.append(label)
        out.append(traj_labels)
    return out


def _group_keys(group_ids: Sequence[Hashable] | torch.Tensor) -> list[Hashable]:
    # The elements of a tensor are new objects on every access, hashed by identity: as dict keys no two would match.
    return group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)


def _check_norm(norm: str) -> None:
    if norm not in GIGPO_NORMS:
        raise ValueError(f"norm must be one of {GIGPO_NORMS}, got {norm!r}")


def _normalized(value: float, mean: float, std: float, norm: str, eps: float) -> float:
    # verl-agent's mode "mean_norm" removes the std (remove_std=True); "mean_std_norm" divides by std + eps.
    return value - mean if norm == "mean" else (value - mean) / (std + eps)


def gigpo_episode_advantages(
    episode_scores: Sequence[float],
    step_counts: Sequence[int],
    group_ids: Sequence[Hashable] | torch.Tensor,
    norm: str = "mean",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Episode-relative advantages A_E (GiGPO Eq. 3; verl-agent ``episode_norm_reward``), one per trajectory.

    verl-agent's batch has one row per step, each carrying its episode's score, and its default
    ``compute_mean_std_cross_steps=True`` takes the group's mean and unbiased std over those ROWS: a trajectory of
    n steps counts n times. A_E = score - mean (``norm="mean"``) or (score - mean) / (std + eps) (``"mean_std"``).
    A task group with a single row has mean 0 and std 1 (so A_E = score there), as in verl-agent.

    Args:
        episode_scores: per trajectory, its episode reward (verl-agent: the sum of its step rewards).
        step_counts: per trajectory, its number of steps (rows).
        group_ids: per trajectory, its task group.
        norm: one of ``GIGPO_NORMS`` (shared with the step advantages, as verl-agent's ``mode``).
        eps: the std stabiliser (verl-agent's ``epsilon``, 1e-6).

    Returns:
        [N] float64 tensor.
    """
    _check_norm(norm)
    group_ids = _group_keys(group_ids)
    if not len(episode_scores) == len(step_counts) == len(group_ids):
        raise ValueError(
            f"{len(episode_scores)} scores, {len(step_counts)} step counts and {len(group_ids)} group ids"
        )
    rows: dict[Hashable, list[float]] = defaultdict(list)
    for score, count, gid in zip(episode_scores, step_counts, group_ids, strict=True):
        rows[gid].extend([float(score)] * int(count))
    stats = {
        gid: (float(group.mean()), float(group.std())) if group.numel() > 1 else (0.0, 1.0)
        for gid, group in ((gid, torch.tensor(values, dtype=torch.float64)) for gid, values in rows.items())
    }
    advantages = [
        _normalized(float(score), *stats[gid], norm, eps)
        for score, gid in zip(episode_scores, group_ids, strict=True)
    ]
    return torch.tensor(advantages, dtype=torch.float64)


def gigpo_step_advantages(
    observations: Sequence[Sequence[str]],
    step_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable] | torch.Tensor,
    gamma: float = 0.95,
    norm: str = "mean",
    eps: float = 1e-6,
    similarity_threshold: float | None = None,
) -> list[torch.Tensor]:
    """Step-relative advantages A_S (GiGPO Eq. 7; verl-agent ``step_norm_reward``): discounted returns normalised
    within anchor-state groups.

    A_S(s, a) = (R - mean_G) / F_norm over the anchor group G of the step. ``norm="mean"`` (verl-agent's
    "mean_norm") takes F_norm = 1; ``norm="mean_std"`` takes F_norm = std_G + eps with the unbiased std, and std
    1 for a one-member group (both as in verl-agent). A step whose state no other step of its task group shares
    is its own group, so its A_S is exactly 0.

    Args:
        observations: per trajectory, one observation string per step.
        step_rewards: per trajectory, the reward after each step (ALFWorld: 0 ... 0, then 10 on success in
            verl-agent; any scale works).
        group_ids: per trajectory, its task group.
        gamma: discount (verl-agent's GiGPO launchers: ``algorithm.gamma=0.95``).
        norm: one of ``GIGPO_NORMS``.
        eps: std stabiliser for ``norm="mean_std"``.
        similarity_threshold: anchor-state matching, see ``anchor_state_groups``.

    Returns:
        One float64 tensor per trajectory with one A_S per step.
    """
    _check_norm(norm)
    if len(step_rewards) != len(observations):
        raise ValueError(f"{len(observations)} observation lists but {len(step_rewards)} reward lists")
    for i, (obs, rew) in enumerate(zip(observations, step_rewards, strict=True)):
        if len(obs) != len(rew):
            raise ValueError(f"trajectory {i}: {len(obs)} observations but {len(rew)} rewards")
    returns = [discounted_returns(r, gamma) for r in step_rewards]
    labels = anchor_state_groups(observations, group_ids, similarity_threshold)
    members: dict[int, list[float]] = defaultdict(list)
    for traj_labels, traj_returns in zip(labels, returns, strict=True):
        for label, ret in zip(traj_labels, traj_returns, strict=True):
            members[label].append(ret)
    stats: dict[int, tuple[float, float]] = {}
    for label, values in members.items():
        group = torch.tensor(values, dtype=torch.float64)
        stats[label] = (float(group.mean()), float(group.std()) if group.numel() > 1 else 1.0)
    return [
        torch.tensor(
            [_normalized(ret, *stats[label], norm, eps) for label, ret in zip(traj_labels, traj_returns, strict=True)],
            dtype=torch.float64,
        )
        for traj_labels, traj_returns in zip(labels, returns, strict=True)
    ]


def gigpo_advantages(
    observations: Sequence[Sequence[str]],
    step_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable] | torch.Tensor,
    omega: float = 1.0,
    gamma: float = 0.95,
    norm: str = "mean",
    eps: float = 1e-6,
    similarity_threshold: float | None = None,
) -> list[torch.Tensor]:
    """GiGPO per-step advantages A = A_E + omega A_S (GiGPO Eq. 8; verl-agent
    ``compute_gigpo_outcome_advantage``), one tensor per trajectory.

    Both terms are GiGPO's own: A_E from ``gigpo_episode_advantages`` on the episode scores (the sum of each
    trajectory's step rewards, verl-agent's ``episode_rewards``), A_S from ``gigpo_step_advantages``, one ``norm``
    for both, as verl-agent's ``mode``. So omega = 0 is not the trainer's GRPO advantage: it is GRPO's statistics
    taken over step rows, without the std under ``norm="mean"``. The caller broadcasts each step's value over that
    step's response tokens.

    Args:
        observations, step_rewards, group_ids, gamma, norm, eps, similarity_threshold: as in
            ``gigpo_step_advantages``.
        omega: step-advantage weight (verl-agent's ``step_advantage_w``, 1.0).

    Returns:
        One float64 tensor per trajectory with one advantage per step.
    """
    steps = gigpo_step_advantages(
        observations, step_rewards, group_ids, gamma=gamma, norm=norm, eps=eps,
        similarity_threshold=similarity_threshold,
    )
    scores = [sum(float(r) for r in rewards) for rewards in step_rewards]
    a_e = gigpo_episode_advantages(scores, [len(r) for r in step_rewards], group_ids, norm=norm, eps=eps)
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
    weights = gibbs_weights(evidence, counts, [(0, len(counts))], temperature=temperature, eps=eps)
    shaped = a * weights.unsqueeze(-1).expand(gap.shape)
    return torch.where(keep, shaped, torch.zeros_like(shaped))
