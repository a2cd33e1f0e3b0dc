"""Group-relative outcome advantages (TASPO paper, Sec. 3.1).

This is the baseline credit every method in the package starts from: one scalar advantage per trajectory,
shared by all of its turns. TASPO and the other credit methods only redistribute it inside a trajectory.
"""

from __future__ import annotations

import torch

__all__ = ["grpo_outcome_advantages"]


def _nan_std_unbiased(grouped: torch.Tensor) -> torch.Tensor:
    """Row-wise unbiased std ignoring NaNs; NaN for rows with fewer than two finite values.

    Same formula as ``trl.trainer.utils.nanstd``, re-implemented so the credit math does not import the trainer
    stack. The Bessel factor is computed in the rewards' dtype (TRL's is float32), so float64 rewards get a
    float64-accurate std; float32 rewards give TRL's numbers.
    """
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    variance = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True).to(variance.dtype)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    return torch.sqrt(variance * correction)


def grpo_outcome_advantages(
    rewards: torch.Tensor,
    group_size: int,
    delta: float = 1e-4,
    scale: bool = True,
) -> torch.Tensor:
    """GRPO advantages A_i = (R_i - mu_G) / (sigma_G + delta) (Sec. 3.1, the equation above Eq. 1).

    Args:
        rewards: 1-D tensor of verified terminal rewards, one per trajectory. The ``group_size`` siblings of one
            task are consecutive rows (TRL's sampler repeats each prompt ``num_generations`` times). NaN marks an
            unscorable trajectory.
        group_size: K, the number of rollouts per task; ``len(rewards)`` must be a multiple of it.
        delta: the stabiliser delta > 0 (TRL uses 1e-4).
        scale: divide by ``sigma_G + delta``; ``False`` gives TRL's ``scale_rewards="none"`` (mean-centering only).

    Returns:
        Tensor shaped like ``rewards`` (floating dtype of ``rewards``; integer rewards become float32).

    Conventions, chosen to match TRL 1.16's ``_generate_and_score_completions``:
        * sigma is the unbiased (Bessel-corrected) std over the group's non-NaN rewards;
        * NaN rewards are left out of mu and sigma and get advantage 0;
        * a group with fewer than two scorable rewards gets advantage 0 everywhere when scaling (its sigma is
          undefined), and ``group_size == 1`` gives 0 because R_i - mu = 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"len(rewards)={rewards.numel()} is not a multiple of group_size={group_size}")
    if not delta > 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if torch.isinf(rewards).any():
        # An infinite reward would turn the whole group's advantages into NaN/inf silently.
        raise ValueError("rewards must be finite or NaN (unscorable); got an infinite reward")
    if rewards.numel() == 0:
        return rewards.clone()

    grouped = rewards.view(-1, group_size)
    centered = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if scale:
        if group_size > 1:
            std = _nan_std_unbiased(grouped)
        else:
            std = torch.zeros_like(centered[:, :1])
        centered = centered / (std + delta)
    # NaN here means either an unscorable row or an undefined group std: neither carries a learning signal.
    advantages = torch.where(torch.isnan(centered), torch.zeros_like(centered), centered)
    return advantages.reshape(rewards.shape)
