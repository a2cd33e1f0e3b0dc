"""Every training method by name, GRPO's own and the comparison methods' alike, as verl selects its advantage
estimators: a recipe's ``method:`` and ``taspo_trl.trainers.method_classes`` read this one table.

Two kinds of entry share it:

* a method with a trainer of its own (``register_method``: GRPO, TASPO and AlignOPSD, registered by
  ``taspo_trl.trainers``): its ``config`` and ``trainer`` classes, whose ``turn_advantages`` computes the credit;
* a credit function (``register_credit``), which ``BaselineTrainer`` (``BaselineConfig(baseline=<name>)``) looks up
  with ``get_credit`` and calls in one of two ways, which the entry's ``teacher`` decides:

  - ``teacher=None``: ``fn(batch: OutcomeBatch, args, step)`` on the batch of all processes, returning each
    trajectory's per-turn advantages (a float per turn, or a list with one per response token);
  - ``teacher="self"`` (the policy under a privileged context built from ``pi_source``) or ``"external"`` (another
    model, ``teacher_model_name_or_path``, under the plain prompt): the trainer first scores every turn under the
    teacher and calls ``fn(gaps: TeacherGaps, args, step)`` once per trajectory, returning its [turns, T]
    per-token advantages (read on the masked tokens only).

``args`` is the trainer's config and ``step`` the optimizer step. ``register_credit`` adds a method, yours
included; docs/credit-methods.md ("Your own credit method") shows one registered and run from a recipe. The built-in entries
at the bottom are the comparison methods of docs/credit-methods.md ("Comparison methods"); OPSD's generalised-JSD
variant is not built (docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .baselines import (
    gigpo_advantages,
    opid_advantages,
    rlsd_advantages,
    rlsd_lambda,
    stepopsd_advantages,
)
from .distillation import gradient_equivalent_advantages, sampled_reverse_kl, sdar_loss, skill_sd_loss

__all__ = [
    "CREDIT_METHODS",
    "TEACHERS",
    "CreditMethod",
    "OutcomeBatch",
    "TeacherGaps",
    "get_credit",
    "register_credit",
    "register_method",
]

TEACHERS = (None, "self", "external")
"""``CreditMethod.teacher``: none, the policy under a privileged context, or another frozen model."""


@dataclass(frozen=True)
class OutcomeBatch:
    """A teacher-free method's view of the whole batch (every process's trajectories, in order)."""

    advantages: torch.Tensor
    """[N] GRPO outcome advantage A_i per trajectory."""
    observations: list[list[str]]
    """Per trajectory, the observation each turn acted on (the first is the task's initial observation)."""
    rewards: list[list[float]]
    """Per trajectory, the environment reward of each turn."""
    groups: list[int]
    """Per trajectory, its task group (the K siblings of one task share it)."""


@dataclass(frozen=True)
class TeacherGaps:
    """One trajectory's teacher pass, [turns, T] with T its longest response; 0 wherever ``mask`` is 0."""

    advantage: torch.Tensor
    """[turns] the trajectory's outcome advantage A_i, on every turn."""
    delta: torch.Tensor
    """Delta_t = log pi_T(y_t | context + h) - log pi_old(y_t | h) on every scored response token."""
    mask: torch.Tensor
    """1 on the tokens the teacher scored (a turn it did not score is all 0)."""
    student: torch.Tensor
    """log pi_old(y_t | h), the plain reference the gaps subtract (also on unscored turns)."""
    step_delta: torch.Tensor
    """The gaps under each turn's step skill (methods with ``step_skills``), else 0."""


@dataclass(frozen=True)
class CreditMethod:
    """A registered credit method: its function and what the trainer must prepare before calling it.

    The defaults (``pi_source``, ``teacher_policy``, ``distill_coef``) fill the config fields left at ``None``.
    """

    name: str
    fn: Callable[..., Any] | None
    """The credit function ``BaselineTrainer`` calls; None for a method with a trainer of its own."""
    teacher: str | None = None
    """None, "self" or "external" (see ``TEACHERS``): which call convention, and which teacher scores."""
    outcome: bool = True
    """A turn the teacher did not score keeps A_i; False (distillation-only methods): it gets 0."""
    pi_source: str = "nearest_success"
    """The self-teacher's privileged context by default (``PrivilegedContextConfig.pi_source``)."""
    teacher_policy: str = "current"
    """The self-teacher's weights by default: "initial", "current" or "periodic" (``teacher_policy``)."""
    distill_coef: float = 0.0
    """lambda of the method's distillation term by default (``distill_coef``)."""
    step_skills: bool = False
    """Also rescore each turn under its analyzer-written step skill (``TeacherGaps.step_delta``; OPID)."""
    prompt_skills: bool = False
    """Show the task's skills in the policy's own prompt (``prompt_skill_bank`` defaults to ``skill_bank``)."""
    title: str = ""
    """Display name (model cards, logs); defaults to ``name``."""
    summary: str = ""
    """What the method does, in a few words (the header of its generated recipes)."""
    paper: str = ""
    """Who introduced the method (``"Feng et al."``), linked from the model card when ``paper_id`` is set."""
    paper_id: str = ""
    """arXiv id of the method's paper (``"2505.10978"``), for the model card; empty: the card cites no paper."""
    metrics: Callable[[Any, int], dict[str, float]] | None = None
    """Extra per-step metrics, ``metrics(args, step) -> {name: value}``."""
    config: type | None = None
    """The config class of a method with a trainer of its own (``register_method``); None: ``BaselineConfig``."""
    trainer: type | None = None
    """That method's trainer class, whose ``turn_advantages`` is its credit; None: ``BaselineTrainer`` calls ``fn``."""


CREDIT_METHODS: dict[str, CreditMethod] = {}
"""Every registered method by name (lower case): the trainers' own and the credit functions."""


def _key(name: str, caller: str) -> str:
    key = str(name).strip().lower()
    if not key:
        raise ValueError(f"{caller} needs a non-empty name.")
    return key


def _store(method: CreditMethod, same: Callable[[CreditMethod], bool]) -> None:
    known = CREDIT_METHODS.get(method.name)
    if known is not None and not same(known):
        owner = (known.trainer or known.fn).__qualname__
        raise ValueError(f"credit method {method.name!r} is already registered ({owner}); pick another name.")
    CREDIT_METHODS[method.name] = method


def register_credit(name: str, fn: Callable[..., Any] | None = None, **spec: Any) -> Any:
    """Register ``fn`` as the credit method ``name`` with the ``CreditMethod`` settings ``spec``; used as a
    decorator when ``fn`` is left out. A name can be registered once (registering the same function again is a
    no-op), so a typo cannot silently replace a built-in method."""
    key = _key(name, "register_credit")
    if spec.get("teacher") not in TEACHERS:
        raise ValueError(f"teacher must be one of {TEACHERS}, got {spec.get('teacher')!r}.")

    def add(function: Callable[..., Any]) -> Callable[..., Any]:
        _store(CreditMethod(key, function, **{"title": key, **spec}), lambda known: known.fn is function)
        return function

    return add if fn is None else add(fn)


def register_method(name: str, *, config: type, trainer: type, **spec: Any) -> None:
    """Register a method whose credit its own trainer computes (``trainer.turn_advantages``), with its config class
    and the ``CreditMethod`` settings ``spec`` (title, paper). Registering the same trainer again is a no-op."""
    key = _key(name, "register_method")
    method = CreditMethod(key, None, **{"title": key, **spec}, config=config, trainer=trainer)
    _store(method, lambda known: known.trainer is trainer)


def get_credit(name: str) -> CreditMethod:
    """The method registered as ``name`` (case-insensitive); ValueError listing the known names."""
    key = str(name).strip().lower()
    if key not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {name!r}; known: {', '.join(sorted(CREDIT_METHODS))}")
    return CREDIT_METHODS[key]


# --------------------------------------------------------------------------------------------------------------
# the comparison methods; ``args`` is a ``BaselineConfig``


def _distilled(
    loss: Callable[..., torch.Tensor], gaps: TeacherGaps, with_outcome: bool, **settings: Any
) -> torch.Tensor:
    """A distillation term as its gradient-equivalent advantage (``gradient_equivalent_advantages``), added to
    A_i on the scored tokens unless the method is distillation only."""
    distill = gradient_equivalent_advantages(loss, gaps.student, gaps.student + gaps.delta, gaps.mask, **settings)
    return distill + (gaps.advantage.unsqueeze(1) * gaps.mask if with_outcome else 0.0)


def skill_grpo_credit(batch: OutcomeBatch, args: Any, step: int) -> list[list[float]]:
    """Skill-GRPO: GRPO's credit (A_i on every turn); the skills are in the policy's prompt."""
    return [[float(a)] * len(rewards) for a, rewards in zip(batch.advantages, batch.rewards, strict=True)]


def gigpo_credit(batch: OutcomeBatch, args: Any, step: int) -> list[list[float]]:
    """GiGPO: A = A_E + omega A_S over anchor-state groups, which span a task group's siblings; both terms are
    GiGPO's own normalisation of the environment rewards (``batch.advantages`` is not used)."""
    steps = gigpo_advantages(
        batch.observations, batch.rewards, batch.groups,
        omega=args.gigpo_omega, gamma=args.gigpo_gamma, norm=args.gigpo_norm,
        similarity_threshold=args.gigpo_similarity_threshold,
    )
    return [values.tolist() for values in steps]


def opsd_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """OPSD: the sampled-token reverse KL to the self-teacher alone."""
    return _distilled(sampled_reverse_kl, gaps, False, coef=args.distill_coef)


def grpo_opsd_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """GRPO+OPSD: A_i plus OPSD's term."""
    return _distilled(sampled_reverse_kl, gaps, True, coef=args.distill_coef)


def sdar_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """SDAR: A_i plus the sigmoid-gated distillation term, whose advantage form is distill_coef sigma(beta Delta)."""
    return _distilled(sdar_loss, gaps, True, coef=args.distill_coef, beta=args.sdar_beta)


def skill_sd_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """Skill-SD: A_i plus the importance-weighted term; old = the snapshot, so the weight is 1 at the first
    update."""

    def with_old_logprobs(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return skill_sd_loss(student, teacher, gaps.student, mask, **kwargs)

    return _distilled(with_old_logprobs, gaps, True, coef=args.distill_coef, is_clip=args.skill_sd_is_clip)


def opd_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """OPD: OPSD's reverse KL to a separate, larger frozen teacher under the plain prompt."""
    return _distilled(sampled_reverse_kl, gaps, False, coef=args.distill_coef)


def rlsd_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """RLSD: A_i reweighted by the clipped teacher ratio, lambda decaying over the first steps (counted from 1, as
    the official trainer counts them; ``rlsd_lambda``)."""
    lam = rlsd_lambda(step, args.rlsd_lambda, args.rlsd_decay_steps)
    return rlsd_advantages(gaps.advantage, gaps.delta, gaps.mask, lam, args.rlsd_clip)


def opid_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """OPID: A_i plus the weighted episode- and step-skill gaps."""
    return opid_advantages(
        gaps.advantage, gaps.delta, gaps.step_delta, gaps.mask, args.opid_episode_weight, args.opid_step_weight
    )


def stepopsd_credit(gaps: TeacherGaps, args: Any, step: int) -> torch.Tensor:
    """StepOPSD (approximate): a sign-preserving per-step budget from the hindsight teacher's gaps."""
    return stepopsd_advantages(
        float(gaps.advantage[0]), gaps.delta, gaps.mask, args.stepopsd_temperature, args.stepopsd_bound
    )


def _rlsd_metrics(args: Any, step: int) -> dict[str, float]:
    return {"baseline/rlsd_lambda": rlsd_lambda(step, args.rlsd_lambda, args.rlsd_decay_steps)}


register_credit(
    "skill_grpo", skill_grpo_credit, prompt_skills=True, title="Skill-GRPO",
    summary="GRPO with retrieved skills in the policy prompt",
    paper="Lu et al. (reproduced with SDAR)", paper_id="2605.15155",
)
register_credit(
    "gigpo", gigpo_credit, title="GiGPO", summary="episode advantage plus anchor-state step advantage, gamma 0.95",
    paper="Feng et al.", paper_id="2505.10978",
)
register_credit(
    "opsd", opsd_credit, teacher="self", outcome=False, pi_source="generic_skill", teacher_policy="initial",
    distill_coef=1.0, title="OPSD",
    summary="on-policy self-distillation from the skill-conditioned initial policy, no reward",
    paper="Zhao et al.", paper_id="2601.18734",
)
register_credit(
    "grpo_opsd", grpo_opsd_credit, teacher="self", pi_source="generic_skill", teacher_policy="initial",
    distill_coef=0.1, title="GRPO+OPSD", summary="GRPO plus an ungated self-distillation term",
    paper="Zhao et al. (OPSD)", paper_id="2601.18734",
)
register_credit(
    "sdar", sdar_credit, teacher="self", pi_source="generic_skill", distill_coef=0.01, title="SDAR",
    summary="GRPO plus sigmoid-gated self-distillation, lambda 0.01, beta 5",
    paper="Lu et al.", paper_id="2605.15155",
)
register_credit(
    "skill_sd", skill_sd_credit, teacher="self", pi_source="success_skills", teacher_policy="periodic",
    distill_coef=0.1, title="Skill-SD",
    summary="GRPO plus importance-weighted reverse KL to a teacher given skills from the agent's successes",
    paper="Wang et al.", paper_id="2604.10674",
)
register_credit(
    "opd", opd_credit, teacher="external", outcome=False, distill_coef=1.0, title="OPD",
    summary="reverse KL to a larger frozen teacher, no reward",
    paper="Agarwal et al. (GKD)", paper_id="2306.13649",
)
register_credit(
    "rlsd", rlsd_credit, teacher="self", pi_source="generic_skill", title="RLSD", metrics=_rlsd_metrics,
    summary="reward sets the sign, the skill-conditioned teacher the size; lambda 0.5 decayed over 50 steps",
    paper="Yang et al.", paper_id="2604.03128",
)
register_credit(
    "opid", opid_credit, teacher="self", pi_source="aligned", step_skills=True, title="OPID",
    summary="outcome advantage plus 0.001 x the episode-guidance and step-skill gaps",
    paper="Yang, Wu et al.", paper_id="2606.26790",
)
register_credit(
    "stepopsd", stepopsd_credit, teacher="self", title="StepOPSD",
    summary="approximation: hindsight-teacher gaps as a per-step credit budget",
    paper="Zhang et al.", paper_id="2605.27140",
)
