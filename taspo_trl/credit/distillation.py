"""Distillation loss terms of the comparison methods: OPSD, GRPO+OPSD, SDAR, Skill-SD and OPD.

docs/credit-methods.md ("Comparison methods") says what each method is. One small pure function per loss, verl ``core_algos.py``
style.

Convention (the same for every term): inputs are [rows, T] over the response tokens of per-turn rows; the student
log-probs ``student_logp`` carry gradient, the teacher's ``teacher_logp`` (and ``old_logp``) are detached here.
Each function returns a PER-TOKEN loss [rows, T], already multiplied by its coefficient and exactly 0 outside
``mask``; the trainer aggregates it with its own ``loss_type`` (token mean, sequence mean, or the turn-balanced
Eq. 7 weights of ``taspo_trl.credit.normalization``), exactly as it aggregates the GRPO policy loss. The "mean"
in the papers' formulas is that aggregation.

Sampled-token reverse KL. On the student's own samples y_t ~ pi_theta, KL(pi_theta || pi_T) at position t is
estimated by k1_t = log pi_theta(y_t) - log pi_T(y_t), and its on-policy (score-function) gradient is
sg(k1_t) grad log pi_theta(y_t). The pathwise gradient of k1 alone would be grad log pi_theta(y_t), whose
expectation under pi_theta is 0, i.e. it does not move the student towards the teacher at all. So
``sampled_reverse_kl`` returns the VALUE k1_t with the GRADIENT sg(k1_t) grad log pi_theta(y_t). That gradient is
the one of TRL 1.16's ``trl.experimental.sdpo.loss_utils.compute_sampled_token_self_distillation_loss``
(``(student - teacher).detach() * student``, the sampled-token mode of ``sdpo``/``sdft`` with alpha = 1); only the
reported value differs (TRL's surrogate value has no meaning, ours is the KL estimate and is 0 when the teacher
equals the student).

    sampled_reverse_kl     the estimator above; the OPSD loss (privileged self-teacher frozen at the initial
                           policy) and the OPD loss (a larger frozen teacher; GKD, 2306.13649) with coef = 1,
                           and GRPO+OPSD's term (coef = lam, added to the outcome advantage, ungated)
    sdar_gate / sdar_loss  SDAR (Lu et al., 2605.15155) as its code computes it: coef sigma(beta sg(Delta))
                           (log pi_T - log pi_theta), lam = 0.01; its advantage form coef sigma(beta Delta) is >= 0
    skill_sd_loss          Skill-SD (Wang et al., 2604.10674): clipped-IS-weighted reverse KL, lam = 0.1
    teacher_version        which step's policy a self-teacher synchronised every N steps holds (Skill-SD)

Not built: OPSD's generalised-JSD variant. A divergence over the full vocabulary has a gradient on every logit,
not only on the sampled token, so it has no per-token advantage form (``gradient_equivalent_advantages``) and
would need a loss path of its own holding the teacher's logits (docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "sampled_reverse_kl",
    "sdar_gate",
    "sdar_loss",
    "gradient_equivalent_advantages",
    "importance_weights",
    "skill_sd_loss",
    "teacher_version",
]


def _check_pair(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if not (student_logp.shape == teacher_logp.shape == mask.shape) or mask.dim() != 2:
        raise ValueError(
            "student_logp, teacher_logp and mask must share one [rows, T] shape, got "
            f"{tuple(student_logp.shape)}, {tuple(teacher_logp.shape)}, {tuple(mask.shape)}"
        )
    return mask.bool()


def _masked_teacher(teacher_logp: torch.Tensor, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # Padding may hold -inf or NaN log-probs; zero them so they cannot reach the arithmetic below.
    teacher = teacher_logp.detach().to(like.dtype)
    return torch.where(keep, teacher, torch.zeros_like(teacher))


def sampled_reverse_kl(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, coef: float = 1.0
) -> torch.Tensor:
    """Per-token sampled-token reverse KL, coef * (log pi_theta(y_t) - sg(log pi_T(y_t))) (OPSD; OPD).

    Value: coef * k1_t. Gradient w.r.t. ``student_logp``: coef * sg(k1_t) (the score-function gradient of
    KL(pi_theta || pi_T), = TRL ``sdpo``'s sampled-token gradient; see the module notes). Minimising it raises
    log pi_theta(y_t) where the teacher likes y_t more than the student (k1 < 0) and lowers it where less.

    OPSD (Zhao et al., 2601.18734): ``teacher_logp`` = the initial policy's log-probs under the privileged
    context. OPD (GKD, 2306.13649): ``teacher_logp`` = a larger frozen model's log-probs; no reward term.

    Returns:
        [rows, T] per-token loss, 0 outside the mask (0 everywhere, with zero gradient, when teacher == student).
    """
    keep = _check_pair(student_logp, teacher_logp, mask)
    teacher = _masked_teacher(teacher_logp, keep, student_logp)
    log_ratio = torch.where(keep, student_logp - teacher, torch.zeros_like(student_logp)).detach()
    # log_ratio * (x - sg(x)) is 0 in value and has gradient log_ratio: value k1, gradient sg(k1) grad log pi.
    surrogate = log_ratio + log_ratio * (student_logp - student_logp.detach())
    return coef * torch.where(keep, surrogate, torch.zeros_like(surrogate))


def sdar_gate(delta: torch.Tensor, beta: float = 5.0) -> torch.Tensor:
    """SDAR's token gate g_t = sigma(beta sg(Delta_t)), Delta_t = log pi_T(y_t) - log pi_theta(y_t) (the ``gate``
    of the official ``compute_sdar_loss``).

    Opens (-> 1) on teacher-endorsed tokens (Delta > 0), closes softly (-> 0) on teacher rejections (Delta < 0),
    and is 1/2 at Delta = 0. Detached: the gate only weights the distillation term.
    """
    return torch.sigmoid(beta * delta.detach())


def sdar_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float = 0.01,
    beta: float = 5.0,
) -> torch.Tensor:
    """SDAR's gated distillation term, per token: coef * g_t * (sg(log pi_T(y_t)) - log pi_theta(y_t)), with the
    gate g_t = sigma(beta sg(Delta_t)) (Lu et al., 2605.15155).

    The official code's ``compute_sdar_loss`` (``verl/trainer/ppo/sdar_utils.py`` of SDAR, ZJU-REAL/SDAR, and
    the same function in Align-OPSD, mingju-c/Align-OPSD) computes exactly this per-token matrix, aggregates it
    with the actor's ``loss_agg_mode`` and ADDS ``coef`` times it to the policy loss; here the trainer's
    ``loss_type`` does the aggregation. The value is the gated gap coef * g_t * Delta_t, and the gradient w.r.t.
    ``student_logp`` is -coef * g_t (the teacher term and the gate are detached). Minimising it therefore raises
    log pi_theta(y_t) of every sampled token with the weight coef * g_t in (0, coef): strongly where the teacher
    endorses the token (Delta > 0, gate open), barely where it rejects it (gate nearly closed). It never lowers a
    token: its advantage form (``gradient_equivalent_advantages``) is +coef * sigma(beta Delta_t) >= 0. With
    beta = 0 the gate is 1/2 everywhere (SDAR's own GRPO+OPSD launchers run it that way).

    Args:
        coef: lam, ``algorithm.sdar.sdar_coef`` (SDAR's launchers 0.01). beta: gate sharpness,
            ``algorithm.sdar.gate_beta`` (launchers 5). Teacher = the policy itself with skills in its context
            (training only).

    Returns:
        [rows, T] per-token loss, 0 outside the mask.
    """
    keep = _check_pair(student_logp, teacher_logp, mask)
    teacher = _masked_teacher(teacher_logp, keep, student_logp)
    gate = sdar_gate(teacher - student_logp.detach(), beta)
    gated_gap = gate * (teacher - student_logp)
    return coef * torch.where(keep, gated_gap, torch.zeros_like(gated_gap))


def importance_weights(student_logp: torch.Tensor, old_logp: torch.Tensor, clip: float | None = 2.0) -> torch.Tensor:
    """Truncated importance weights sg(min(pi_theta / pi_old, clip)) on the sampled tokens.

    Corrects for the samples coming from the rollout snapshot pi_old when the student has already moved
    (several optimisation steps per generation). Same as TRL ``sdpo``/``sdft``'s
    ``apply_importance_sampling_clipping``: log-ratio clamped to [-20, 20] before exp (overflow), upper clip only
    (the weight must not explode; a small one only damps), detached; ``clip=None`` disables the clip.
    """
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None, got {clip!r}")
    ratio = torch.exp((student_logp.detach() - old_logp.detach().to(student_logp.dtype)).clamp(-20.0, 20.0))
    return ratio if clip is None else ratio.clamp(max=clip)


def skill_sd_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float = 0.1,
    is_clip: float | None = 2.0,
) -> torch.Tensor:
    """Skill-SD's importance-weighted reverse KL, per token: coef * rho_t * k1_t (Wang et al., 2604.10674).

    rho_t = ``importance_weights(student_logp, old_logp, is_clip)`` (TRL's clipped-IS choice, default clip 2.0;
    the paper's exact clip is not stated in its specification). Teacher = the policy conditioned on skills summarised
    from the agent's own trajectories, periodically synced (the caller's job; ``teacher_version``). Gradient w.r.t.
    ``student_logp``: coef * rho_t * sg(log pi_theta - log pi_T).

    Args:
        coef: lam (SDAR's reimplementation: 0.1).

    Returns:
        [rows, T] per-token loss, 0 outside the mask.
    """
    keep = _check_pair(student_logp, teacher_logp, mask)
    if old_logp.shape != keep.shape:
        raise ValueError(f"old_logp {tuple(old_logp.shape)} does not match mask {tuple(keep.shape)}")
    old = torch.where(keep, old_logp.detach().to(student_logp.dtype), student_logp.detach())
    rho = importance_weights(student_logp, old, is_clip)
    return rho * sampled_reverse_kl(student_logp, teacher_logp, mask, coef)


def teacher_version(step: int, sync_steps: int) -> int:
    """The optimizer step whose policy a self-teacher synchronised every ``sync_steps`` steps holds at ``step``:
    step - (step mod sync_steps), the last multiple of ``sync_steps`` not after ``step``.

    ``sync_steps`` = 1 gives ``step`` (refreshed every step: the rollout snapshot); 0 means never refreshed and
    gives 0 (the initial policy); N >= 2 gives a frozen copy refreshed at steps 0, N, 2N, ... (Skill-SD).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    if sync_steps < 0:
        raise ValueError(f"sync_steps must be >= 0, got {sync_steps!r}")
    return 0 if sync_steps == 0 else step - step % sync_steps


def gradient_equivalent_advantages(
    loss_fn: Callable[..., torch.Tensor],
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    **loss_kwargs: Any,
) -> torch.Tensor:
    """Per-token advantages whose policy-gradient step equals the step of a per-token loss term: -d loss_t / d logp_t.

    At the rollout snapshot (PPO ratio 1) the clipped surrogate -A_t ratio_t has gradient -A_t grad log pi(y_t),
    and a loss l_t(log pi(y_t)) has gradient (d l_t / d logp_t) grad log pi(y_t); with A_t = -d l_t / d logp_t the
    two coincide. So a distillation term joins the outcome advantage additively, goes through the trainer's one
    clipped loss and normalisation, and costs no second forward pass with gradients. For the sampled-token reverse
    KL this gives A_t = coef (log pi_T - log pi_theta) = coef Delta_t, the usual on-policy-distillation advantage.

    Returns:
        [rows, T] detached advantages, 0 outside the mask.
    """
    leaf = student_logp.detach().clone().requires_grad_(True)
    loss = loss_fn(leaf, teacher_logp, mask, **loss_kwargs)
    (grad,) = torch.autograd.grad(loss.sum(), leaf, allow_unused=True)
    if grad is None:
        return torch.zeros_like(leaf.detach())
    return torch.where(mask.bool(), -grad, torch.zeros_like(grad))
