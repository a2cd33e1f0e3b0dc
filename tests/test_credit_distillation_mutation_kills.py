"""Behaviour of ``taspo_trl.credit.distillation`` that its unit tests in ``test_credit_baselines.py`` left open
(found with ``benchmarks/mutation.sh``; the equivalent survivors are in
``benchmarks/results/mutation_distillation_equivalent.md``): the defaults the papers' launchers fix, the shape
and ``clip`` errors a user sees, the [-20, 20] clamp of the importance log-ratio, the dtype of the losses when the
teacher's log-probs come in another precision, and a loss term that does not depend on the student.

Every expected number is worked out by hand in the test's docstring or comment."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch

from taspo_trl.credit.distillation import (
    gradient_equivalent_advantages,
    importance_weights,
    sampled_reverse_kl,
    sdar_gate,
    sdar_loss,
    skill_sd_loss,
)

F64 = torch.float64
LN4 = math.log(4.0)

# --------------------------------------------------------------------------------------------------------------
# input checks shared by the losses


@pytest.mark.parametrize("loss_fn", [sampled_reverse_kl, sdar_loss])
def test_losses_reject_mismatched_shapes_and_name_each_shape(loss_fn: Callable[..., torch.Tensor]) -> None:
    """A teacher row shorter than the student's is refused, and the message lists the three shapes in order."""
    message = "student_logp, teacher_logp and mask must share one [rows, T] shape, got (2, 3), (2, 2), (2, 3)"
    with pytest.raises(ValueError, match=re.escape(message)):
        loss_fn(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


@pytest.mark.parametrize("shape", [(1, 2, 3), (3,)])
def test_losses_reject_equal_shapes_that_are_not_rows_by_tokens(shape: tuple[int, ...]) -> None:
    """Equal shapes are not enough: the inputs must be 2-D [rows, T] (a 3-D or 1-D batch is refused)."""
    got = ", ".join([str(shape)] * 3)
    message = f"student_logp, teacher_logp and mask must share one [rows, T] shape, got {got}"
    with pytest.raises(ValueError, match=re.escape(message)):
        sampled_reverse_kl(torch.zeros(shape), torch.zeros(shape), torch.ones(shape))


def test_losses_keep_the_students_dtype_when_the_teacher_is_in_another_precision() -> None:
    """A bf16 student with float32 teacher log-probs gets a bf16 loss (the teacher is cast to the student's dtype).

    sampled_reverse_kl: k1 = s - t = [-1 + 1.5, -2 + 2] = [0.5, 0] (exact in bf16).
    sdar_loss (coef 1, beta 0, gate 1/2): 1/2 * (t - s) = [-0.25, 0].
    """
    student = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    teacher = torch.tensor([[-1.5, -2.0]], dtype=torch.float32)
    mask = torch.ones(1, 2)
    kl = sampled_reverse_kl(student, teacher, mask)
    sdar = sdar_loss(student, teacher, mask, coef=1.0, beta=0.0)
    assert kl.dtype == torch.bfloat16 and kl.tolist() == [[0.5, 0.0]]
    assert sdar.dtype == torch.bfloat16 and sdar.tolist() == [[-0.25, 0.0]]


# --------------------------------------------------------------------------------------------------------------
# SDAR defaults (the launchers' algorithm.sdar.gate_beta = 5 and sdar_coef = 0.01, see sdar_loss's docstring)


def test_sdar_gate_default_sharpness_is_five() -> None:
    """sdar_gate's default beta is SDAR's launcher value 5.

    Delta = 0.2: sigma(5 * 0.2) = sigma(1) = 1 / (1 + e^-1) = 1 / 1.3678794 = 0.7310586;
    Delta = -0.4: sigma(-2) = 1 / (1 + e^2) = 1 / 8.3890561 = 0.1192029.
    """
    gate = sdar_gate(torch.tensor([0.2, -0.4], dtype=F64))
    assert gate.tolist() == pytest.approx([0.7310585786, 0.1192029220], abs=1e-10)


def test_sdar_loss_defaults_are_coef_one_hundredth_and_beta_five() -> None:
    """sdar_loss with defaults is the launchers' 0.01 * sigma(5 Delta) * Delta.

    s = -1.2, t = -1.0: Delta = 0.2, gate sigma(1) = 0.73105857863,
    loss = 0.01 * 0.73105857863 * 0.2 = 0.00146211715726.
    """
    loss = sdar_loss(torch.tensor([[-1.2]], dtype=F64), torch.tensor([[-1.0]], dtype=F64), torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.00146211715726, abs=1e-13)


# --------------------------------------------------------------------------------------------------------------
# importance weights


def test_importance_weights_default_clip_is_two() -> None:
    """The default clip is 2.0 (TRL sdpo/sdft's clipped IS; skill_sd_loss's docstring): pi/pi_old = e^ln4 = 4 -> 2,
    while e^0 = 1 stays."""
    w = importance_weights(torch.tensor([0.0, 0.0], dtype=F64), torch.tensor([-LN4, 0.0], dtype=F64))
    assert w.tolist() == pytest.approx([2.0, 1.0], abs=1e-12)


def test_importance_log_ratio_is_clamped_to_twenty_either_way() -> None:
    """Unclipped, a log-ratio of -30 gives e^-20 = 2.0611536e-9 and one of +30 gives e^20 = 4.8516520e8 (the
    clamp to [-20, 20] before exp), not e^-30 or e^30."""
    w = importance_weights(torch.tensor([0.0, 0.0], dtype=F64), torch.tensor([30.0, -30.0], dtype=F64), clip=None)
    assert w.tolist() == pytest.approx([2.0611536224e-9, 4.8516519541e8], rel=1e-10)


def test_importance_weights_do_not_overflow_in_float32() -> None:
    """A float32 log-ratio of 100 would overflow exp (e^100 > 3.4e38, the float32 maximum); clamped it is e^20."""
    w = importance_weights(torch.tensor([100.0]), torch.tensor([0.0]), clip=None)
    assert w.item() == pytest.approx(4.8516519541e8, rel=1e-6)


def test_importance_weights_accept_a_clip_below_one() -> None:
    """Any clip > 0 is valid: with clip 0.5 the ratios e^0 = 1 and e^-1 = 0.3678794 become 0.5 and 0.3678794."""
    w = importance_weights(torch.tensor([0.0, -1.0], dtype=F64), torch.tensor([0.0, 0.0], dtype=F64), clip=0.5)
    assert w.tolist() == pytest.approx([0.5, 0.3678794412], abs=1e-10)


@pytest.mark.parametrize("clip", [0.0, -1.0])
def test_importance_weights_reject_a_clip_that_is_not_positive(clip: float) -> None:
    """A clip of 0 (every weight 0) or below is refused with a message naming the value."""
    with pytest.raises(ValueError, match=re.escape(f"clip must be > 0 or None, got {clip!r}")):
        importance_weights(torch.zeros(2), torch.zeros(2), clip=clip)


def test_importance_weights_have_the_students_dtype() -> None:
    """float64 rollout log-probs are cast to a float32 student's dtype, so the weights are float32:
    e^(0 - (-1)) = 2.7182818 -> clip 2."""
    w = importance_weights(torch.tensor([0.0, 0.0]), torch.tensor([-1.0, 0.0], dtype=F64))
    assert w.dtype == torch.float32
    assert w.tolist() == [2.0, 1.0]


# --------------------------------------------------------------------------------------------------------------
# Skill-SD

# One row, two tokens: s = -1, t = [-1.5, -1.25] -> k1 = s - t = [0.5, 0.25]; pi/pi_old = [e^ln4, e^0] = [4, 1].
SKILL_STUDENT = [[-1.0, -1.0]]
SKILL_TEACHER = [[-1.5, -1.25]]
SKILL_OLD = [[-1.0 - LN4, -1.0]]


def skill_sd(**kwargs: float | None) -> list[float]:
    """skill_sd_loss on the row above (float64, both tokens kept)."""
    loss = skill_sd_loss(
        torch.tensor(SKILL_STUDENT, dtype=F64),
        torch.tensor(SKILL_TEACHER, dtype=F64),
        torch.tensor(SKILL_OLD, dtype=F64),
        torch.ones(1, 2),
        **kwargs,
    )
    return loss[0].tolist()


def test_skill_sd_defaults_are_coef_one_tenth_and_clip_two() -> None:
    """Defaults: coef 0.1 (SDAR's reimplementation) and is_clip 2.0 (TRL's clipped IS), per skill_sd_loss's docstring.

    rho = [min(4, 2), 1] = [2, 1]; loss = 0.1 * rho * k1 = [0.1 * 2 * 0.5, 0.1 * 1 * 0.25] = [0.1, 0.025].
    """
    assert skill_sd() == pytest.approx([0.1, 0.025], abs=1e-12)


@pytest.mark.parametrize("is_clip,first", [(3.0, 0.1 * 3 * 0.5), (None, 0.1 * 4 * 0.5)])
def test_skill_sd_weights_with_the_clip_it_is_given(is_clip: float | None, first: float) -> None:
    """is_clip reaches the importance weights: clip 3 gives rho = 3, loss 0.1 * 3 * 0.5 = 0.15; no clip gives
    rho = 4, loss 0.1 * 4 * 0.5 = 0.2. The unclipped second token stays 0.1 * 1 * 0.25 = 0.025."""
    assert skill_sd(is_clip=is_clip) == pytest.approx([first, 0.025], abs=1e-12)


def test_skill_sd_rejects_old_logp_of_another_shape() -> None:
    """Rollout log-probs that do not line up with the mask are refused, naming both shapes."""
    with pytest.raises(ValueError, match=re.escape("old_logp (2, 2) does not match mask (2, 3)")):
        skill_sd_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


# --------------------------------------------------------------------------------------------------------------
# gradient-equivalent advantages


def test_advantages_of_a_term_that_ignores_the_student_are_zero() -> None:
    """A loss term with no path to the student's log-probs (here one that only trains the teacher) moves the
    policy by nothing, so its advantages are 0 everywhere (not an autograd error about an unused input)."""
    teacher = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)

    def teacher_only(student: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return teacher_logp * mask

    adv = gradient_equivalent_advantages(teacher_only, torch.tensor([[-0.5, -0.5, -0.5]]), teacher, torch.ones(1, 3))
    assert adv.tolist() == [[0.0, 0.0, 0.0]]
