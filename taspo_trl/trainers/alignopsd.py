"""AlignOPSD: decision-aligned supervision rectification (mechanism 1) and semi-Markov credit (mechanism 2), as
the authors' trainer runs them (``BeyondTimestampsRayTrainer`` of ``mingju-c/Align-OPSD``). Only the credit hook
differs from the GRPO baseline. One step:

1. outcome advantages A_i (GRPO over trajectories, or over turn rows: ``grpo_normalization_scope``);
2. p_x: the top-k SkillBank skills of each task (the teacher's privileged context; an empty skill block where
   retrieval gives none, so every trajectory has a teacher, as in the official trainer);
3. one teacher response per turn, generated under p_x through the rollout backend (vLLM when ``use_vllm``), in
   every task group once some group's credit can move (``span_threshold_scope``: the span threshold pools the
   whole batch), or in none;
4. per group: H = teacher thinking at the source x student thinking at the target, structural eligibility,
   selection (threshold, one source per sibling, top-k), the optional action filter, the dense profiles and the
   adjacent-profile distances;
5. per target turn: the diagonal score (its response under its own p_x), the cross scores (its response under
   each selected source's teacher prompt), omega, rho, alpha and the corrected gap against the recomputed old
   log-probs;
6. spans (the quantile threshold over every group's valid distances, strongest-first boundaries, max-length
   repair; ablation D seeds its random spans with the trajectory's index in (task, rollout) order),
   outcome-aligned turn scores, two-level budgets, the box projection and mixing: A_it = A_i w_it;
7. plus the turn-normalised invalid-action residual.
Steps 1 and 7 read the episode reward as the official environments pay it (``reward_scale``, ``outcome_reward``).
8. with ``sdar_aux`` (the ALFWorld-3B launcher), plus SDAR's gated term on every token scored under its own p_x.
The loss is TRL's token-mean ``dapo`` loss.
"""

from __future__ import annotations

import logging
import math
import textwrap
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from accelerate.utils import gather_object

from ..credit.alignopsd import (
    ABLATIONS,
    AGGREGATION_MODES,
    NORMALIZATION_SCOPES,
    PROFILE_DISTANCES,
    corrected_token_gap,
    correction_strength,
    correspondence_confidence,
    cross_teacher_logprobs,
    flat_token_weights,
    flat_turn_weights,
    group_outcome_advantage,
    hierarchical_turn_weights,
    invalid_action_residual,
    segment_trajectory,
    segmentation_threshold,
    source_log_weights,
    turn_gap,
)
from ..credit.distillation import gradient_equivalent_advantages, sdar_loss
from ..credit.grpo import grpo_outcome_advantages
from ..credit.turns import TurnCredit, TurnValue, add_to_tokens
from ..privileged.alignopsd import (
    GroupCorrespondence,
    cross_view_requests,
    group_correspondence,
    parse_response,
    skill_contexts,
    teacher_contexts,
    teacher_prompts,
)
from ..privileged.encoder import get_encoder
from ..privileged.rescoring import score_continuations
from ..privileged.skillbank import SkillBank
from ..rollout.generation import generator_for_trainer
from ..rollout.records import Trajectory
from .grpo import AgentGRPOConfig, AgentGRPOTrainer
from .step import StepView

logger = logging.getLogger(__name__)


@dataclass
class AlignOPSDConfig(AgentGRPOConfig):
    r"""Configuration of [`AlignOPSDTrainer`]: every field of [`AgentGRPOConfig`] (and `trl.GRPOConfig`), plus
    AlignOPSD's. Names follow the official configuration (`algorithm.thinking_correspondence.*` for mechanism 1,
    `algorithm.mechanism2.*` for mechanism 2). Where the six official launchers disagree, the default is the value
    most of them set; the recipes `paper/<benchmark>/alignopsd_official_<size>` carry each launcher's values.

    Parameters:
        skill_bank / skill_top_k (`AgentGRPOConfig`'s, defaults `"alfworld"` / `2`): the SkillBank of p_x.
        encoder_path (`str` or `None`): sentence encoder folder, or a Hub id found in the local Hugging Face cache
            (nothing is downloaded); `None` = the packaged all-MiniLM-L6-v2 (the official encoder is
            Qwen3-Embedding-0.6B).
        similarity_threshold (`float`, defaults to `0.8`): $\tau$, the thinking cosine a source must reach, and
            the best eligible source of a valid profile (launchers: 0.65 to 0.8).
        source_top_k (`int`, defaults to `3`): $k$, sources kept per target turn (one per sibling rollout).
        aggregation_temperature (`float`, defaults to `0.1`): temperature of $\omega = \mathrm{softmax}(s / T)$.
        aggregation_mode (`str`, defaults to `"probability_mixture"`): $\log \sum_k \omega_k p_k$, or
            `"log_mean"` $\sum_k \omega_k \log p_k$ (the Search-3B profile).
        alpha_max (`float`, defaults to `0.8`): $\alpha_{\max}$, the cap of the correction strength
            $\alpha = \min(\alpha_{\max} \rho, \alpha_{\max})$.
        action_filter (`bool`, defaults to `False`): the action-consistency filter (launchers: ALFWorld-3B and
            WebShop-3B; the paper applies it on every benchmark).
        action_threshold (`float`, defaults to `0.8`): action-embedding cosine of the filter.
        teacher_max_new_tokens (`int` or `None`, defaults to `None`): the teacher response budget
            (`teacher_max_response_length`); `None` = `max_completion_length`, as in the official code (five of the
            six launchers set 2048).
        profile_temperature (`float`, defaults to `0.1`): temperature of the dense profiles $P$.
        profile_distance (`str`, defaults to `"jsd"`): adjacent-profile distance, normalised Jensen-Shannon or
            `"cosine"`.
        segmentation_quantile (`float`, defaults to `0.8`): the batch quantile of the valid distances...
        segmentation_threshold_min / segmentation_threshold_max (`float`, defaults to `0.01` / `0.10`): ...clipped
            to this range; the minimum is also the least distance of a guided max-length split.
        span_threshold_scope (`str`, defaults to `"batch"`): whose valid distances the span threshold pools.
            `"batch"` (official: `adaptive_segmentation_threshold` over every canonical turn of the batch): every
            task group's, whether or not its credit can move, so once any group moves, the groups that cannot
            also get teacher responses and are encoded and matched (teacher generation and encoder time grow
            with their share of the batch's turns; a step where no group moves still runs nothing). `"moving"`:
            only the groups whose credit can move, which skips that work and changes the threshold whenever the
            other groups' distances would move the quantile. Only the method (`"E"`) and ablation A use the
            threshold; B, C and D run the teacher for the moving groups only under either setting.
        span_min_turns / span_max_turns (`int`, defaults to `2` / `8`): span length limits
            (`min_segment_turns` / `max_segment_turns`).
        credit_temperature (`float`, defaults to `0.5`): temperature of the two-level budgets.
        mixing_coefficient (`float`, defaults to `0.5`): $w = (1 - m) + m x$ of the projected density $x$.
        density_upper_bound (`float`, defaults to `4.0`): the box $[0, h_{\max}]$ of the projection (`legacy`).
        weighting_mode (`str`, defaults to `"legacy"`): `"legacy"` box $[0, h_{\max}]$, or `"bounded"`
            $[1 - b, 1 + b]$.
        multiplier_band (`float`, defaults to `0.2`): $b$ of the bounded mode.
        grpo_normalization_scope (`str`, defaults to `"turn"`): GRPO statistics over turn rows (each reward once
            per turn) or over `"trajectory"`s. The official launchers set `"turn"` in five of six profiles
            (`"trajectory"` on Search-3B); the official config file's own default is `"trajectory"`, its legacy.
        advantage_epsilon (`float`, defaults to `1e-6` here): the official GRPO epsilon.
        invalid_action_coef (`float`, defaults to `0.1`): coefficient $c$ of the invalid-action residual (0.01 on
            Search); 0 turns it off. Use it instead of `invalid_action_penalty`, which would enter the outcome. It
            acts on the episode reward as `reward_scale` and `outcome_reward` give it: the residual relative to
            the outcome advantage shrinks as the reward grows.
        reward_scale (`float`, defaults to `10.0`): the episode reward R of the outcome advantage and of the
            invalid-action residual is `reward_scale` times the reward `outcome_reward` names (no symbol in the
            paper; the official environments pay 10 for a win on ALFWorld, as verl-agent's, and on WebShop, and the
            exact match, 1, on Search, whose recipes set 1.0). The outcome advantage is scale-free up to
            `advantage_epsilon`; the residual is not: with binary rewards, `reward_scale: 1` makes $c = 0.1$ act as
            $c = 1$ would at the official scale.
        outcome_reward (`str`, defaults to `"env"`): `"env"`, the environment's reward (WebShop: the graded
            purchase score in [0, 1]); or `"win"`, 1 for a won episode and 0 otherwise (`Trajectory.won`; an
            unscorable reward stays unscorable), as the official environments pay (WebShop: 10 on a win, 0
            otherwise, in its `envs.py`). The two agree on ALFWorld and Search-QA, whose rewards are already 1 on
            a win and 0 otherwise. The official-profile recipes set `"win"`. Neither changes the rewards TRL logs.
        ablation (`str`, defaults to `"E"`): the official ablations: `"A"` no rectification ($\alpha_{\max} = 0$),
            `"B"` token allocation, `"C"` turn allocation without spans, `"D"` random spans, `"E"` the method.
        sdar_aux (`bool`, defaults to `False`): the official SDAR auxiliary loss (`algorithm.sdar_aux.enabled`),
            which the paper does not describe and only the ALFWorld-3B launcher turns on: every policy token of a
            trajectory with a privileged context gets $+c\,\sigma(\beta\,\mathrm{sg}(\log \pi_T - \log \pi_\theta))$
            added to its advantage, $\pi_T$ the turn's own (diagonal) privileged teacher. That is the gradient of the
            official `compute_sdar_loss` term at the rollout snapshot (`credit.distillation.sdar_loss`). Off is the
            paper's reading.
        sdar_aux_coef (`float`, defaults to `0.01`): $c$ (`algorithm.sdar_aux.coef`).
        sdar_aux_gate_beta (`float`, defaults to `5.0`): $\beta$ of the gate (`algorithm.sdar_aux.gate_beta`).
        turn_balanced_loss: defaults to `False` here: the official loss is the token mean.
    """

    encoder_path: str | None = field(default=None, metadata={"help": "Sentence encoder folder or cached Hub id."})
    similarity_threshold: float = field(default=0.8, metadata={"help": "tau: thinking cosine of a source."})
    source_top_k: int = field(default=3, metadata={"help": "k: sources per target turn."})
    aggregation_temperature: float = field(default=0.1, metadata={"help": "Temperature of omega."})
    aggregation_mode: str = field(default="probability_mixture", metadata={"help": "probability_mixture | log_mean."})
    alpha_max: float = field(default=0.8, metadata={"help": "alpha_max: cap of the correction strength."})
    action_filter: bool = field(default=False, metadata={"help": "Action-consistency filter."})
    action_threshold: float = field(default=0.8, metadata={"help": "Action cosine of the filter."})
    teacher_max_new_tokens: int | None = field(default=None, metadata={"help": "Teacher response budget."})
    profile_temperature: float = field(default=0.1, metadata={"help": "Temperature of the dense profiles."})
    profile_distance: str = field(default="jsd", metadata={"help": "jsd | cosine."})
    segmentation_quantile: float = field(default=0.8, metadata={"help": "Quantile of the span threshold."})
    segmentation_threshold_min: float = field(default=0.01, metadata={"help": "Lower clip of the span threshold."})
    segmentation_threshold_max: float = field(default=0.10, metadata={"help": "Upper clip of the span threshold."})
    span_min_turns: int = field(default=2, metadata={"help": "Shortest span (turns)."})
    span_max_turns: int = field(default=8, metadata={"help": "Longest span (turns)."})
    credit_temperature: float = field(default=0.5, metadata={"help": "Temperature of the budgets."})
    mixing_coefficient: float = field(default=0.5, metadata={"help": "w = (1 - m) + m * projected density."})
    density_upper_bound: float = field(default=4.0, metadata={"help": "Upper bound of the projection box."})
    weighting_mode: str = field(default="legacy", metadata={"help": "legacy | bounded."})
    multiplier_band: float = field(default=0.2, metadata={"help": "Band of the bounded weighting."})
    grpo_normalization_scope: str = field(default="turn", metadata={"help": "turn | trajectory."})
    advantage_epsilon: float = field(default=1e-6, metadata={"help": "epsilon of the GRPO advantage."})
    invalid_action_coef: float = field(default=0.1, metadata={"help": "Invalid-action residual coefficient."})
    reward_scale: float = field(default=10.0, metadata={"help": "Episode reward scale (official: 10 on a win)."})
    outcome_reward: str = field(default="env", metadata={"help": "env (the environment's reward) | win (1 on a win)."})
    span_threshold_scope: str = field(default="batch", metadata={"help": "batch (official) | moving."})
    ablation: str = field(default="E", metadata={"help": "A | B | C | D | E (E: the method)."})
    turn_balanced_loss: bool = field(default=False, metadata={"help": "Eq. 7 balancing (off: token-mean loss)."})
    sdar_aux: bool = field(default=False, metadata={"help": "Official SDAR auxiliary loss (ALFWorld-3B launcher)."})
    sdar_aux_coef: float = field(default=0.01, metadata={"help": "Coefficient of the SDAR auxiliary term."})
    sdar_aux_gate_beta: float = field(default=5.0, metadata={"help": "Gate sharpness of the SDAR auxiliary term."})

    def __post_init__(self):
        super().__post_init__()
        choices = {
            "aggregation_mode": AGGREGATION_MODES, "profile_distance": PROFILE_DISTANCES,
            "grpo_normalization_scope": NORMALIZATION_SCOPES, "ablation": ABLATIONS,
            "weighting_mode": ("legacy", "bounded"), "outcome_reward": ("env", "win"),
            "span_threshold_scope": ("batch", "moving"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}.")
        if not -1.0 <= self.similarity_threshold < 1.0:
            raise ValueError(f"similarity_threshold must be in [-1, 1), got {self.similarity_threshold}.")
        if not 0.0 <= self.alpha_max <= 1.0:
            raise ValueError(f"alpha_max must be in [0, 1], got {self.alpha_max}.")
        if not 0.0 <= self.mixing_coefficient <= 1.0:
            raise ValueError(f"mixing_coefficient must be in [0, 1], got {self.mixing_coefficient}.")
        if self.density_upper_bound < 1.0:
            raise ValueError(f"density_upper_bound must be >= 1, got {self.density_upper_bound}.")
        if self.span_min_turns < 1 or self.span_max_turns < 2 * self.span_min_turns - 1:
            raise ValueError("span_max_turns must be at least 2 * span_min_turns - 1 so every trajectory can be split.")
        if not 0.0 <= self.segmentation_threshold_min <= self.segmentation_threshold_max <= 1.0:
            raise ValueError("need 0 <= segmentation_threshold_min <= segmentation_threshold_max <= 1.")
        if self.source_top_k < 1:
            raise ValueError(f"source_top_k must be >= 1, got {self.source_top_k}.")
        if self.teacher_max_new_tokens is not None and self.teacher_max_new_tokens < 1:
            raise ValueError(f"teacher_max_new_tokens must be None or >= 1, got {self.teacher_max_new_tokens}.")
        if not (math.isfinite(self.sdar_aux_coef) and self.sdar_aux_coef >= 0):
            raise ValueError(f"sdar_aux_coef must be a finite number >= 0, got {self.sdar_aux_coef}.")
        if not (math.isfinite(self.sdar_aux_gate_beta) and self.sdar_aux_gate_beta > 0):
            raise ValueError(f"sdar_aux_gate_beta must be a finite number > 0, got {self.sdar_aux_gate_beta}.")
        if self.invalid_action_coef < 0:
            raise ValueError(f"invalid_action_coef must be >= 0, got {self.invalid_action_coef}.")
        if not (math.isfinite(self.reward_scale) and self.reward_scale > 0):
            raise ValueError(f"reward_scale must be a finite number > 0, got {self.reward_scale}.")
        if self.invalid_action_penalty:
            raise ValueError(
                "AlignOPSD keeps the episode outcome untouched and adds invalid actions as a separate residual: "
                "set invalid_action_coef instead of invalid_action_penalty."
            )


class AlignOPSDTrainer(AgentGRPOTrainer):
    """AlignOPSD. Used exactly like `trl.GRPOTrainer`, with an `AlignOPSDConfig`; `skill_bank=` and `encoder=`
    optionally pass ready objects instead of the configured ones."""

    _tag_names = ["trl", "grpo", "taspo-trl", "alignopsd"]
    _name = "AlignOPSD"
    _paper = {
        "title": "Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents",
        "citation": textwrap.dedent("""\
            @misc{alignopsd2026,
                title = {{Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents}},
                year  = {2026},
                url   = {https://github.com/mingju-c/Align-OPSD},
                note  = {AlignOPSD; preprint},
            }"""),
    }

    def __init__(self, *args: Any, skill_bank: SkillBank | None = None, encoder: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, AlignOPSDConfig):
            raise TypeError(f"AlignOPSDTrainer needs an AlignOPSDConfig, got {type(self.args).__name__}.")
        self.encoder = encoder or get_encoder(self.args.encoder_path)
        self.skill_bank = skill_bank or SkillBank.load(self.args.skill_bank, encoder=self.encoder)

    def turn_advantages(self, step: StepView) -> TurnCredit:
        """A_i w_it (+ the invalid-action residual) of every turn, per token in ablation B: the module
        docstring's steps 1-7. ``last_step`` keeps the weights, spans and skills. Lists over the whole batch are
        indexed like ``step.everything``; ``step.local`` slices out this process's trajectories."""
        args = self.args
        everything, groups = step.everything, step.groups
        outcome = self._outcome_advantages(step)
        mine = outcome[step.local]

        skills = skill_contexts(self.skill_bank, everything, args.skill_top_k)
        contexts = teacher_contexts(skills)  # no skill still gives a teacher, as in the official trainer
        correspondences, threshold, seconds = self._match(step, groups, outcome, contexts)

        started = time.perf_counter()
        # SDAR's auxiliary term needs the diagonal teacher on every trajectory, moving or not.
        targets = [i for i, a in enumerate(mine) if a != 0]
        scored = set(range(len(mine))) if args.sdar_aux else set(targets)
        target_contexts = [c if i in scored else "" for i, c in enumerate(contexts[step.local])]
        diagonal_gaps, plain = self._privileged_shifts(step, target_contexts, action_only=False)
        plain_turns = step.rows.collect(plain)
        corrected, cross_views, alphas = self._corrected_gaps(
            step, targets, contexts, correspondences, diagonal_gaps, plain_turns
        )
        seconds += (time.perf_counter() - started,)

        seeds = _trajectory_order(everything)[step.local]
        weights, spans = TurnCredit(), []
        for i, trajectory in enumerate(step.trajectories):
            if i in corrected:
                w, s = self._allocate(trajectory, corrected[i], float(mine[i]), correspondences[trajectory.group],
                                      step.first + i, threshold, seeds[i])
            else:
                w, s = [1.0] * trajectory.num_turns, ([(0, trajectory.num_turns)] if trajectory.num_turns else [])
            weights.append(w)
            spans.append(s)
        residuals = self._invalid_residuals(step)

        self.last_step.weights, self.last_step.spans = weights, spans
        self.last_step.skill_texts = skills[step.local]
        self._log_weight_range(weights, step.mode)
        self._log_alignment(correspondences, spans, alphas, seconds, cross_views, threshold)
        advantages = weights.scaled([float(a) for a in mine], residuals)
        if args.sdar_aux:
            self._add_sdar_auxiliary(advantages, diagonal_gaps, plain_turns)
        return advantages

    def _match(
        self, step: StepView, groups: dict[int, list[int]], outcome: list[float], contexts: list[str]
    ) -> tuple[dict[int, GroupCorrespondence], float, tuple[float, float]]:
        """Steps 2-3 and the span threshold of step 6: teacher responses under p_x in the groups whose credit
        moves (and those the threshold pools), each group's correspondence, and the batch's span threshold; with
        the seconds of the teacher generation and of the encoder and matching."""
        args = self.args
        # Credit moves only in groups with a nonzero advantage (a zero advantage stays zero under any weights); the
        # span threshold may pool every group's distances, which needs the teacher there too.
        moving = {g for g, members in groups.items() if any(outcome[j] != 0 for j in members)}
        matched = self._matched_groups(groups, moving)
        started = time.perf_counter()
        teacher = self._teacher_responses(step, contexts, matched)
        teacher_seconds = time.perf_counter() - started

        started = time.perf_counter()
        correspondences = {
            g: group_correspondence(
                step.everything, members, teacher, self.encoder, threshold=args.similarity_threshold,
                top_k=args.source_top_k, action_filter=args.action_filter, action_threshold=args.action_threshold,
                profile_temperature=args.profile_temperature, profile_distance=args.profile_distance,
            )
            for g, members in groups.items()
            if g in matched
        }
        # The span threshold pools every valid distance of the matched groups; every process sees the whole batch.
        computed = list(correspondences.values())
        threshold = segmentation_threshold(
            torch.cat([c.distances for c in computed]) if computed else torch.zeros(0, dtype=torch.float64),
            torch.cat([c.boundary_valid for c in computed]) if computed else torch.zeros(0, dtype=torch.bool),
            args.segmentation_quantile, args.segmentation_threshold_min, args.segmentation_threshold_max,
        )
        return correspondences, threshold, (teacher_seconds, time.perf_counter() - started)

    def _add_sdar_auxiliary(
        self,
        advantages: TurnCredit,
        diagonal_gaps: dict[tuple[int, int], torch.Tensor],
        plain_turns: dict[tuple[int, int], torch.Tensor],
    ) -> None:
        """The official SDAR auxiliary loss (``algorithm.sdar_aux``; ``compute_sdar_loss`` on the diagonal teacher
        log-probs), added in place as its gradient-equivalent advantage coef * sigma(beta Delta_t) on every scored
        token. Turns without a finite diagonal score of every response token keep their advantage."""
        args, added = self.args, []
        for (i, t), gap in diagonal_gaps.items():
            student = plain_turns.get((i, t))
            # A gap that misses some of the turn's tokens, or is not finite, would misplace or poison the term.
            if student is None or gap.numel() == 0 or student.numel() != gap.numel() or not bool(torch.isfinite(gap).all()):
                continue
            student = student.double()
            term = gradient_equivalent_advantages(
                sdar_loss, student[None], (gap.double() + student)[None], torch.ones(1, gap.numel()),
                coef=args.sdar_aux_coef, beta=args.sdar_aux_gate_beta,
            )[0].tolist()
            add_to_tokens(advantages, i, t, term)
            added += term
        metrics = self._metrics[self.metrics_mode]
        metrics["alignopsd/sdar_aux_mean"].append(sum(added) / max(len(added), 1))

    def _matched_groups(self, groups: dict[int, list[int]], moving: set[int]) -> set[int]:
        """The task groups that get teacher responses, encoding and matching: the ``moving`` ones, plus, when the
        span threshold pools the whole batch (``span_threshold_scope: batch``, official) and the method uses it
        (ablations E and A), every other group, since its valid distances enter the quantile. None when nothing
        moves: the threshold then changes no advantage."""
        if moving and self.args.span_threshold_scope == "batch" and self.args.ablation in ("A", "E"):
            return set(groups)
        return set(moving)

    def _episode_rewards(self, step: StepView) -> torch.Tensor:
        """The episode reward R of every trajectory of the step as the official environments pay it: ``reward_scale``
        times the environment's reward (``outcome_reward: env``) or times 1 for a win, 0 otherwise (``win``).
        Unscorable (NaN) rewards stay NaN."""
        args = self.args
        rewards = step.rewards.detach().double().cpu()
        if args.outcome_reward == "win":
            won = torch.tensor([1.0 if t.won else 0.0 for t in step.everything], dtype=torch.float64)
            rewards = torch.where(torch.isnan(rewards), rewards, won)
        return args.reward_scale * rewards

    def _outcome_advantages(self, step: StepView) -> list[float]:
        """Official ``compute_unique_trajectory_grpo_advantage`` of every trajectory of the step (over each
        task group of ``step.groups``) on the episode rewards of ``_episode_rewards``. The trajectory scope is the
        base trainer's own computation (the same statistics: bit for bit what GRPO gives on the same rewards); the
        turn scope repeats each reward once per turn of its trajectory in the statistics. Unscorable (NaN) rewards
        get 0 and stay out of the statistics."""
        args = self.args
        everything, groups = step.everything, step.groups
        rewards = self._episode_rewards(step)
        scale = self.scale_rewards != "none"
        if args.grpo_normalization_scope == "trajectory":
            group_size = len(everything) // max(len(groups), 1)
            # In the rewards' own dtype: with reward_scale 1 and the environment's reward, GRPO's exact numbers.
            rewards = rewards.to(step.rewards.dtype)
            return grpo_outcome_advantages(rewards, group_size, delta=args.advantage_epsilon, scale=scale).tolist()
        out = [0.0] * len(everything)
        for members in groups.values():
            scorable = [j for j in members if not bool(torch.isnan(rewards[j]))]
            if len(scorable) < 2:
                continue
            values = group_outcome_advantage(
                rewards[scorable], [everything[j].num_turns for j in scorable],
                scope="turn", epsilon=args.advantage_epsilon, scale=scale,
            )
            for j, value in zip(scorable, values.tolist()):
                out[j] = value
        return out

    @property
    def _teacher_tokens(self) -> int:
        budget = self.args.teacher_max_new_tokens
        return self.args.max_completion_length if budget is None else budget

    @contextmanager
    def _teacher_budget(self) -> Iterator[None]:
        """The teacher's response budget on the vLLM path, which reads it from TRL's generation object per call."""
        engine = getattr(self, "vllm_generation", None) if self.use_vllm else None
        if engine is None:
            yield
            return
        saved = engine.max_completion_length
        engine.max_completion_length = self._teacher_tokens
        try:
            yield
        finally:
            engine.max_completion_length = saved

    def _teacher_responses(
        self, step: StepView, contexts: list[str], matched: set[int]
    ) -> dict[tuple[int, int], tuple[str, str]]:
        """(thinking, action) of one teacher response per turn of every trajectory in a ``matched`` group (official
        ``_generate_teacher_responses``): generated under p_x by the rollout backend with the rollout's sampling
        settings and the teacher budget, each process its own trajectories, then shared. Nothing runs, on any
        process, when no group is matched (every process sees the same batch)."""
        if not matched:
            return {}
        everything = step.everything
        wanted = [j for j in range(len(everything))[step.local] if everything[j].group in matched]
        prompts, keys = teacher_prompts(everything, wanted, contexts, self.chat)
        generator = generator_for_trainer(self, batch_size=self.args.rollout_batch_size)
        if hasattr(generator, "max_new_tokens"):
            generator.max_new_tokens = self._teacher_tokens
        with self._teacher_budget():
            generations = generator(prompts)  # every process calls once: the vLLM server call is collective
        parsed = [parse_response(self._tokenizer.decode(g.token_ids, skip_special_tokens=True)) for g in generations]
        mine = list(zip(keys, parsed))
        shared = gather_object(mine) if self.accelerator.num_processes > 1 else mine
        return {tuple(key): tuple(value) for key, value in shared}

    def _corrected_gaps(
        self,
        step: StepView,
        targets: list[int],
        contexts: list[str],
        correspondences: dict[int, GroupCorrespondence],
        diagonal_gaps: dict[tuple[int, int], torch.Tensor],
        plain_turns: dict[tuple[int, int], torch.Tensor],
    ) -> tuple[dict[int, list[torch.Tensor | None]], int, list[float]]:
        """Official ``combine_cross_teacher_scores`` for every turn of ``targets`` (this process's trajectories, by
        their index in ``step.trajectories``): the corrected gap per response token (None for a turn that was not
        scored), the number of cross views scored, and alpha of every matched turn. Every process scores, even
        nothing: the pass may be collective."""
        args, everything = self.args, step.everything
        alpha_max = 0.0 if args.ablation == "A" else args.alpha_max
        requests, owners = [], []
        for i in targets if alpha_max > 0 else []:
            j = step.first + i
            views, view_owners = cross_view_requests(correspondences[everything[j].group], j, everything, contexts, self.chat)
            requests += views
            owners += [(i, t, source) for t, source in view_owners]
        with self._scoring_passes():
            scored = score_continuations(
                requests, self._snapshot_logprobs, self._tokenizer.pad_token_id,
                min_rows=self._max_over_processes(len(requests)), batch_size=self.rescore_batch_size,
            )
        cross: dict[tuple[int, int, int], torch.Tensor] = {key: logps.double() for key, logps in zip(owners, scored)}
        alphas: list[float] = []
        out: dict[int, list[torch.Tensor | None]] = {}
        for i in targets:
            c = correspondences[step.trajectories[i].group]
            gaps: list[torch.Tensor | None] = []
            for row in c.rows_of(step.first + i):
                t = c.keys[row][1]
                local_gap, student = diagonal_gaps.get((i, t)), plain_turns.get((i, t))
                if local_gap is None or student is None:
                    gaps.append(None)
                    continue
                student = student[: local_gap.numel()].double()
                diagonal = local_gap.double() + student
                sources = c.selected[row] if alpha_max > 0 else ()
                if not sources:
                    gaps.append(corrected_token_gap(diagonal, student))
                    continue
                similarities = c.similarity[list(sources), row]
                log_omega = source_log_weights(similarities, args.aggregation_temperature)
                omega = log_omega.exp()
                alpha = correction_strength(correspondence_confidence(similarities, omega, args.similarity_threshold), alpha_max)
                # The cross views score the turn's whole response; the diagonal side covers its policy tokens.
                views = torch.stack([cross[(i, t, s)][: diagonal.numel()] for s in sources])
                mixed = cross_teacher_logprobs(views, omega, args.aggregation_mode, log_weights=log_omega)
                gaps.append(corrected_token_gap(diagonal, student, mixed, alpha))
                alphas.append(alpha)
            out[i] = gaps
        return out, len(requests), alphas

    def _allocate(
        self,
        trajectory: Trajectory,
        gaps: list[torch.Tensor | None],
        advantage: float,
        correspondence: GroupCorrespondence,
        index: int,
        threshold: float,
        seed: int = 0,
    ) -> tuple[list[TurnValue], list[tuple[int, int]]]:
        """Mechanism 2 for one trajectory: its weights (per turn; per token in ablation B) and spans; ``seed``:
        ablation D's random-span seed. Turns without a scored policy token keep weight 1 and stay out of the
        budgets (the official code has none)."""
        args = self.args
        n_turns = trajectory.num_turns
        sign = 1.0 if advantage > 0 else -1.0
        live = [t for t in range(n_turns) if gaps[t] is not None and gaps[t].numel() > 0 and bool(torch.isfinite(gaps[t]).all())]
        weights: list[TurnValue] = [1.0] * n_turns
        box = dict(upper=args.density_upper_bound, weighting=args.weighting_mode, band=args.multiplier_band)
        if args.ablation == "B":
            flat = torch.cat([sign * gaps[t] for t in live]) if live else torch.zeros(0, dtype=torch.float64)
            token_w = flat_token_weights(flat, args.credit_temperature, **box)
            sizes = [gaps[t].numel() for t in live]
            for t, part in zip(live, torch.split(token_w, sizes)):
                weights[t] = part.tolist()
            return weights, [(t, t + 1) for t in range(n_turns)]
        scores = [sign * turn_gap(gaps[t]) for t in live]
        counts = [gaps[t].numel() for t in live]
        rows = correspondence.rows_of(index)
        if args.ablation == "C":
            spans = [(0, n_turns)] if n_turns else []  # no segmentation: the trajectory is one unit
            values = flat_turn_weights(scores, counts, args.credit_temperature, args.mixing_coefficient, **box)
        else:
            spans = segment_trajectory(
                correspondence.distances[rows], correspondence.boundary_valid[rows], threshold,
                args.span_min_turns, args.span_max_turns, fallback_min=args.segmentation_threshold_min,
                mode="random" if args.ablation == "D" else "adaptive", seed=seed,
            )
            # Spans over the live turns: a turn without tokens is left out of its span's budget.
            position = {t: k for k, t in enumerate(live)}
            live_spans = []
            for a, b in spans:
                members = [position[t] for t in range(a, b) if t in position]
                if members:
                    live_spans.append((members[0], members[-1] + 1))
            values = (
                hierarchical_turn_weights(scores, counts, live_spans, args.credit_temperature, args.mixing_coefficient, **box)
                if live else torch.zeros(0, dtype=torch.float64)
            )
        for t, value in zip(live, values.tolist()):
            weights[t] = value
        return weights, spans

    def _invalid_residuals(self, step: StepView) -> list[list[float]]:
        """Official ``compute_invalid_action_advantage_residual`` of every turn of this process, over each task
        group's turn rows (every group, whether or not its credit moves); rows of an unscorable (NaN) reward are
        left out; the rewards are ``_episode_rewards``."""
        args, everything = self.args, step.everything
        out = [[0.0] * trajectory.num_turns for trajectory in step.trajectories]
        if args.invalid_action_coef == 0:
            return out
        rewards, mine = self._episode_rewards(step), range(len(everything))[step.local]
        for members in step.groups.values():
            keys = [(j, t) for j in members if not bool(torch.isnan(rewards[j])) for t in range(everything[j].num_turns)]
            if not any(j in mine for j, _ in keys):
                continue
            residual = invalid_action_residual(
                [float(rewards[j]) for j, _ in keys], [not everything[j].turns[t].action_valid for j, t in keys],
                args.invalid_action_coef, args.advantage_epsilon, scale=self.scale_rewards != "none",
            )
            for (j, t), value in zip(keys, residual.tolist()):
                if j in mine:
                    out[j - step.first][t] = value
        return out

    def _log_alignment(
        self,
        correspondences: dict[int, GroupCorrespondence],
        spans: list[list[tuple[int, int]]],
        alphas: list[float],
        seconds: tuple[float, float, float],
        cross_views: int,
        threshold: float,
    ) -> None:
        """The step's AlignOPSD metrics; ``seconds``: teacher generation, encoder and matching, scoring passes."""
        metrics = self._metrics[self.metrics_mode]
        teacher_seconds, encoder_seconds, rescoring_seconds = seconds
        selected = [len(s) for c in correspondences.values() for s in c.selected]
        metrics["alignopsd/match_rate"].append(sum(n > 0 for n in selected) / max(len(selected), 1))
        metrics["alignopsd/mean_matched_sources"].append(sum(selected) / max(len(selected), 1))
        # The mean correction strength alpha over the matched target turns.
        metrics["alignopsd/alpha_mean"].append(sum(alphas) / max(len(alphas), 1))
        valid = [bool(v) for c in correspondences.values() for v in c.profile_valid]
        metrics["alignopsd/profile_valid_rate"].append(sum(valid) / max(len(valid), 1))
        metrics["alignopsd/segmentation_threshold"].append(threshold if threshold != float("inf") else -1.0)
        span_lengths = [end - start for trajectory_spans in spans for start, end in trajectory_spans]
        metrics["alignopsd/span_count"].append(sum(len(s) for s in spans) / max(len(spans), 1))
        metrics["alignopsd/span_length_mean"].append(sum(span_lengths) / max(len(span_lengths), 1))
        metrics["alignopsd/teacher_generation_seconds"].append(teacher_seconds)
        metrics["alignopsd/encoder_seconds"].append(encoder_seconds)
        metrics["alignopsd/rescoring_seconds"].append(rescoring_seconds)
        metrics["alignopsd/cross_views"].append(float(cross_views))


def _trajectory_order(everything: list[Trajectory]) -> list[int]:
    """Each trajectory's index in (task, rollout) order over the whole batch: the official ``segment_trajectories``
    seeds ablation D's random spans with ``random.Random(0 + index)`` in the sorted (task uid, rollout uid) order
    of ``_trajectory_groups``. Here a task is its group and a rollout its place among the group's siblings. (The
    official uids are random strings, so the official order is a random permutation of the batch; the spans'
    distribution is the same, not each trajectory's spans.)"""
    order = sorted(range(len(everything)), key=lambda j: (everything[j].group, j))
    rank = [0] * len(everything)
    for position, j in enumerate(order):
        rank[j] = position
    return rank

