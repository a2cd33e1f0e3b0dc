"""Issue 59's stage-level points, by hand from the official formulas (``mingju-c/Align-OPSD``): omega in log space
(``combine_cross_teacher_scores``), the episode reward as the official environments pay it (``WebshopWorker.step``
in ``webshop/envs.py``, verl-agent's ALFWorld ``compute_reward``) through the outcome advantage
(``compute_unique_trajectory_grpo_advantage``) and the invalid-action residual
(``compute_invalid_action_advantage_residual``), and the new settings' checks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl import AlignOPSDConfig, AlignOPSDTrainer
from taspo_trl.credit.alignopsd import cross_teacher_logprobs, invalid_action_residual, source_log_weights, source_weights
from taspo_trl.privileged.alignopsd import NO_SKILLS, teacher_contexts
from taspo_trl.rollout.records import Trajectory
from taspo_trl.trainers.step import StepView


def test_probability_mixture_in_log_space_at_a_tiny_temperature():
    """Similarities 0.90 and 0.89 at temperature 1e-5: log omega = log_softmax([90000, 89000]) = [0, -1000] (to
    e^-1000), so log(omega_1 p_1 + omega_2 p_2) with log p = -1500 and -10 is
    logsumexp(0 - 1500, -1000 - 10) = -1010 (+ log(1 + e^-490)). Through softmax, omega_2 = e^-1000 underflows to 0
    and the mixture would read -1500."""
    sims = torch.tensor([0.90, 0.89], dtype=torch.float64)
    log_omega = source_log_weights(sims, 1e-5)
    assert log_omega.tolist() == pytest.approx([0.0, -1000.0], abs=1e-6)
    views = torch.tensor([[-1500.0], [-10.0]], dtype=torch.float64)
    mixed = cross_teacher_logprobs(views, log_omega.exp(), "probability_mixture", log_weights=log_omega)
    assert mixed.tolist() == pytest.approx([-1010.0], abs=1e-9)
    # The weights themselves (rho, log mean) are the softmax: 1 and 0 here.
    assert source_weights(sims, 1e-5).tolist() == pytest.approx([1.0, 0.0], abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    sims=st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=4),
    temperature=st.floats(1e-5, 1.0),
    scores=st.lists(st.floats(-2000.0, 0.0), min_size=4, max_size=4),
)
def test_mixture_is_at_least_each_weighted_source(sims, temperature, scores):
    """log sum_k omega_k p_k >= log omega_k + log p_k for every k (a sum of positive terms is at least each term),
    with log omega the official log_softmax, at any temperature: no source's evidence is lost to underflow."""
    s = torch.tensor(sims, dtype=torch.float64)
    views = torch.tensor(scores[: len(sims)], dtype=torch.float64)[:, None]
    log_omega = source_log_weights(s, temperature)
    mixed = float(cross_teacher_logprobs(views, log_omega.exp(), log_weights=log_omega)[0])
    assert math.isfinite(mixed)
    for lw, view in zip(log_omega.tolist(), views[:, 0].tolist()):
        assert mixed >= lw + view - 1e-9 * max(1.0, abs(lw + view))


def test_invalid_residual_at_the_official_reward_scale_by_hand():
    """One win of two turns (the first invalid) and one failure of two turns, c = 0.1. Official rewards 10 per win:
    rows R = [10, 10, 0, 0], R - c invalid = [9.9, 10, 0, 0]; normalised over the rows (mean, unbiased std,
    1e-6) and subtracted: [-0.00872542, 0.00868168, 0.0000219, 0.0000219]. With rewards of 1 the same c gives
    [-0.0932980, 0.0885198, 0.0023891, 0.0023891], about ten times more."""
    official = invalid_action_residual([10.0, 10.0, 0.0, 0.0], [True, False, False, False], 0.1)
    assert official.tolist() == pytest.approx([-0.00872542, 0.008681683, 2.1869e-05, 2.1869e-05], abs=1e-8)
    unit = invalid_action_residual([1.0, 1.0, 0.0, 0.0], [True, False, False, False], 0.1)
    assert unit.tolist() == pytest.approx([-0.093298036, 0.088519815, 0.00238911, 0.00238911], abs=1e-8)


def _episode_host(**settings_):
    host = AlignOPSDTrainer.__new__(AlignOPSDTrainer)
    values = dict(reward_scale=10.0, outcome_reward="env", grpo_normalization_scope="trajectory", advantage_epsilon=1e-6)
    host.args = SimpleNamespace(**{**values, **settings_})
    host.scale_rewards = "group"
    return host


def test_webshop_outcome_is_ten_per_win_as_the_official_environment_pays():
    """WebShop scores [0.9, 0.5, 1.0] (only the last bought the exact item: won). The official ``envs.py`` pays 10 on
    a win and 0 otherwise, so R = [0, 0, 10] and the trajectory-scope advantage is (R - 10/3) / (std + 1e-6) =
    [-0.57735, -0.57735, 1.15470]; the graded score, 10 x [0.9, 0.5, 1.0], would give [0.37796, -1.13389, 0.75593]. An unscorable (NaN)
    reward stays NaN."""
    trajectories = [Trajectory(task_spec={}, task="t", initial_observation="", group=0, won=w) for w in (False, False, True)]
    step = StepView(trajectories, torch.zeros(3), None, {}, rewards=torch.tensor([0.9, 0.5, 1.0]))
    host = _episode_host(outcome_reward="win")
    assert host._episode_rewards(step).tolist() == [0.0, 0.0, 10.0]
    got = host._outcome_advantages(step)
    assert got == pytest.approx([-0.5773501691896431, -0.5773501691896431, 1.1547003383792862], abs=1e-6)
    graded = _episode_host()._outcome_advantages(step)
    assert graded == pytest.approx([0.3779643301521383, -1.133892990456415, 0.7559286603042766], abs=1e-6)
    unscorable = StepView(trajectories, torch.zeros(3), None, {}, rewards=torch.tensor([float("nan"), 0.5, 1.0]))
    assert math.isnan(float(host._episode_rewards(unscorable)[0]))


def test_no_skill_context_is_the_empty_skill_block():
    assert teacher_contexts(["", "[Skills]\n- a\n[End Skills]"]) == [NO_SKILLS, "[Skills]\n- a\n[End Skills]"]
    assert NO_SKILLS == "[Skills]\n[End Skills]"


def test_new_settings_defaults_and_checks(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    config = AlignOPSDConfig(**base)
    assert (config.reward_scale, config.outcome_reward, config.span_threshold_scope) == (10.0, "env", "batch")
    with pytest.raises(ValueError, match="reward_scale must be a finite number > 0"):
        AlignOPSDConfig(reward_scale=0.0, **base)
    with pytest.raises(ValueError, match="outcome_reward"):
        AlignOPSDConfig(outcome_reward="score", **base)
    with pytest.raises(ValueError, match="span_threshold_scope"):
        AlignOPSDConfig(span_threshold_scope="group", **base)
