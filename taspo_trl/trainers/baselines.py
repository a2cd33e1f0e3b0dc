"""The papers' comparison methods as one trainer: pick one with `BaselineConfig(baseline=...)` (or
`method: <name>` in a recipe). Each is a `credit.registry` entry, selected by name, and yours registers the same
way (`register_credit`).

Every method changes only the per-token advantages of the GRPO step (`turn_advantages`):
- redistribution or shaping of the outcome advantage A (RLSD, OPID, StepOPSD), or GiGPO's own episode and step
  advantages;
- distillation terms (OPSD, GRPO+OPSD, SDAR, Skill-SD, OPD), which enter as their gradient-equivalent advantage
  (`credit.distillation.gradient_equivalent_advantages`): at the rollout snapshot the clipped surrogate then takes
  exactly the gradient of `L_GRPO + L_distill`, with no second forward pass;
- Skill-GRPO, which is GRPO with retrieved skills in the policy's own prompt (`prompt_skill_bank`).

Teachers are the policy itself under a privileged context (`privileged.context`, as TASPO builds it: SkillBank
skills, a successful sibling's trajectory, the analyzer's aligned guidance, the analyzer's skills from the
successes, or OPID's step skills), frozen at the initial policy, the current snapshot, or a frozen copy refreshed
every ``teacher_sync_steps`` steps; or (OPD) a separate frozen model with the same tokenizer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import use_adapter

from ..credit.baselines import GIGPO_NORMS
from ..credit.distillation import teacher_version
from ..credit.registry import CREDIT_METHODS, CreditMethod, OutcomeBatch, TeacherGaps, get_credit
from ..credit.turns import TurnCredit
from ..privileged.builder import ANALYZER_SOURCES
from ..privileged.context import (
    PRIVILEGED_DICT_FIELDS,
    Guidance,
    PrivilegedContextConfig,
    build_privileged_context,
    configured_skill_lookup,
    make_analyzer,
)
from ..privileged.protocol import DEFAULT_MAX_STEP_SKILLS
from ..privileged.rescoring import privileged_prompt_ids, score_continuations
from ..rollout.records import Trajectory
from .grpo import AgentGRPOConfig, AgentGRPOTrainer
from .scoring import dropout_off
from .step import StepView

logger = logging.getLogger(__name__)

DEFAULT_TEACHER_SYNC_STEPS = 10
"""Refresh period of a `periodic` teacher (Skill-SD's default): its paper syncs the teacher periodically, and the
period is not in the description this package follows."""
TEACHER_POLICIES = {"initial": 0, "current": 1, "periodic": DEFAULT_TEACHER_SYNC_STEPS}
"""`teacher_policy` names and the `teacher_sync_steps` each stands for."""
_TEACHER_ADAPTER = "teacher"
"""The PEFT adapter that holds a periodic teacher's copy of the policy's adapter."""


@dataclass
class BaselineConfig(AgentGRPOConfig, PrivilegedContextConfig):
    r"""Configuration of [`BaselineTrainer`]: every field of [`AgentGRPOConfig`] and of
    [`PrivilegedContextConfig`] (the PI source and analyzer settings that build the teachers' privileged
    context), plus the comparison methods' settings. docs/methods.md says where each method departs from its paper.

    Parameters:
        baseline (`str`, defaults to `"sdar"`): the credit method, a name registered in `credit.registry`: one of
            `skill_grpo`, `opsd`, `grpo_opsd`, `sdar`, `skill_sd`, `opd`, `rlsd`, `opid`, `gigpo`, `stepopsd`, or
            one of yours (`register_credit`).
        pi_source (`str` or `None`, defaults to `None`): the teacher's privileged context; `None` picks the
            method's: skills (`generic_skill`, from `skill_bank`) for OPSD, GRPO+OPSD, SDAR and RLSD; skills the
            analyzer summarises from the group's other successes (`success_skills`) for Skill-SD; a successful
            sibling (`nearest_success`, TRL `sdpo`'s successful-rollout teacher) for StepOPSD's hindsight teacher
            and methods registered without one; the analyzer's guidance (`aligned`) for OPID's episode term.
        teacher_policy (`str` or `None`, defaults to `None`): the self-teacher's weights, a name for a
            `teacher_sync_steps` value: `"initial"` (0: the frozen initial policy: the PEFT base model, TRL's
            reference model, or a frozen copy), `"current"` (1: the rollout snapshot, i.e. synced every step) or
            `"periodic"` (a frozen copy refreshed every `teacher_sync_steps`, default 10, steps). `None`: from
            `teacher_sync_steps` when set, else the method's: `initial` for OPSD / GRPO+OPSD (OPSD's teacher is
            frozen), `periodic` for Skill-SD (its teacher is synced periodically), `current` otherwise.
        teacher_sync_steps (`int` or `None`, defaults to `None`): how often the self-teacher is refreshed from the
            policy. N >= 2: a frozen copy of the policy (a second PEFT adapter under LoRA) taken at step 0 and
            refreshed whenever the optimizer step reaches a multiple of N, so the teacher of step s is the policy
            of step N * floor(s / N); 1: refreshed every step, i.e. the rollout snapshot (no copy is kept); 0:
            never refreshed, the initial policy. `None`: the value `teacher_policy` names (Skill-SD: 10). Must be
            >= 0 and agree with `teacher_policy` when both are set; not for OPD, whose teacher is another model.
        teacher_model_name_or_path (`str` or `None`): OPD's teacher, a larger causal LM with the policy's tokenizer.
        distill_coef (`float` or `None`): $\lambda$ of the distillation term; `None`: OPSD 1, GRPO+OPSD 0.1, SDAR
            0.01, Skill-SD 0.1, OPD 1 (the method's, 0 for methods without one).
        sdar_beta (`float`, defaults to `5.0`): SDAR's gate sharpness $\beta$; the term's advantage form is
            `distill_coef` $\cdot\sigma(\beta\Delta_t) \ge 0$, as SDAR's code computes it.
        skill_sd_is_clip (`float`, defaults to `2.0`): Skill-SD's importance-weight clip.
        rlsd_lambda (`float`, defaults to `0.5`): RLSD's $\lambda_0$, linearly decayed to 0 over
            `rlsd_decay_steps` (50) steps counted from 1, as the official trainer counts them (the first update
            uses $\lambda_0 (1 - 1/50)$, and from the 50th update on RLSD is GRPO); `rlsd_clip` (0.2) is its
            $\epsilon$.
        opid_episode_weight / opid_step_weight (`float`, default `0.001`): OPID's weights of the episode- and
            step-skill gaps.
        opid_max_step_skills (`int`, defaults to `5`): OPID's step skills per trajectory, at most: the analyzer
            backend (`analyzer`) writes them, each tied to one step, and a step's tokens are rescored under its
            skill for the step gap. 0 turns the step term off.
        gigpo_omega (`float`, defaults to `1.0`): GiGPO's step-advantage weight $\omega$.
        gigpo_gamma (`float`, defaults to `0.95`): GiGPO's discount $\gamma$ for the step returns.
        gigpo_norm (`str`, defaults to `"mean"`): the normalisation of both GiGPO's episode and its step
            advantages (verl-agent's `mode`: `"mean"` is `mean_norm`, its config default and WebShop launcher's;
            `"mean_std"` is `mean_std_norm`, its ALFWorld and Search launchers').
        gigpo_similarity_threshold (`float` or `None`, defaults to `None`): GiGPO's anchor-state matching: `None`
            compares observations exactly (verl-agent's default), a value in (0, 1) merges two states whose
            `difflib` similarity ratio reaches it (verl-agent's `enable_similarity`; its Search launcher: 0.9).
        stepopsd_temperature (`float`, defaults to `1.0`), stepopsd_bound (`float`, defaults to `0.5`): the
            approximate StepOPSD's budget temperature and weight bound.
    """

    baseline: str = field(default="sdar", metadata={"help": f"Comparison method: {', '.join(n for n, m in CREDIT_METHODS.items() if m.trainer is None)} or yours."})
    pi_source: str | None = field(default=None, metadata={"help": "Teacher context (None: the method's)."})
    teacher_policy: str | None = field(
        default=None, metadata={"help": "'initial', 'current' or 'periodic' (None: method's)."}
    )
    teacher_sync_steps: int | None = field(
        default=None, metadata={"help": "Self-teacher refresh period: 0 never, 1 every step, N every N steps."}
    )
    teacher_model_name_or_path: str | None = field(default=None, metadata={"help": "OPD's frozen teacher."})
    distill_coef: float | None = field(default=None, metadata={"help": "lambda of the distillation term."})
    sdar_beta: float = field(default=5.0, metadata={"help": "SDAR gate sharpness beta."})
    skill_sd_is_clip: float = field(default=2.0, metadata={"help": "Skill-SD importance-weight clip."})
    rlsd_lambda: float = field(default=0.5, metadata={"help": "RLSD lambda_0."})
    rlsd_decay_steps: int = field(default=50, metadata={"help": "RLSD lambda decay steps."})
    rlsd_clip: float = field(default=0.2, metadata={"help": "RLSD epsilon."})
    opid_episode_weight: float = field(default=0.001, metadata={"help": "OPID episode-skill weight."})
    opid_step_weight: float = field(default=0.001, metadata={"help": "OPID step-skill weight."})
    opid_max_step_skills: int = field(
        default=DEFAULT_MAX_STEP_SKILLS, metadata={"help": "OPID step skills per trajectory, at most."}
    )
    gigpo_omega: float = field(default=1.0, metadata={"help": "GiGPO omega."})
    gigpo_gamma: float = field(default=0.95, metadata={"help": "GiGPO discount gamma."})
    gigpo_norm: str = field(default="mean", metadata={"help": "GiGPO normalisation: mean or mean_std."})
    gigpo_similarity_threshold: float | None = field(
        default=None, metadata={"help": "GiGPO anchor-state similarity in (0, 1); None: exact match."}
    )
    stepopsd_temperature: float = field(default=1.0, metadata={"help": "StepOPSD budget temperature."})
    stepopsd_bound: float = field(default=0.5, metadata={"help": "StepOPSD weight bound."})

    # TrainingArguments parses these from JSON strings (command line) in its __post_init__.
    _VALID_DICT_FIELDS = [*AgentGRPOConfig._VALID_DICT_FIELDS, *PRIVILEGED_DICT_FIELDS]

    def __post_init__(self):
        functions = tuple(name for name, entry in CREDIT_METHODS.items() if entry.trainer is None)
        if self.baseline not in functions:
            own = CREDIT_METHODS.get(self.baseline)
            fix = f"use {own.config.__name__} and {own.trainer.__name__}" if own else (
                "register yours with taspo_trl.credit.registry.register_credit")
            raise ValueError(f"baseline must be one of {functions} ({fix}), got {self.baseline!r}.")
        method = self.credit_method
        self.pi_source = self.pi_source or method.pi_source
        self._resolve_teacher_schedule(method)
        if self.gigpo_norm not in GIGPO_NORMS:
            raise ValueError(f"gigpo_norm must be one of {GIGPO_NORMS}, got {self.gigpo_norm!r}.")
        threshold = self.gigpo_similarity_threshold
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError(
                f"gigpo_similarity_threshold must be in (0, 1) (verl-agent's Search launcher: 0.9) or None for exact "
                f"anchor-state matching, got {threshold!r}."
            )
        if self.opid_max_step_skills < 0:
            raise ValueError(f"opid_max_step_skills must be >= 0 (0: no step term), got {self.opid_max_step_skills}.")
        if self.distill_coef is None:
            self.distill_coef = method.distill_coef
        if method.teacher == "external" and not self.teacher_model_name_or_path:
            raise ValueError(
                f"baseline={self.baseline!r} needs teacher_model_name_or_path (a larger model with the same tokenizer)."
            )
        if method.prompt_skills and not self.prompt_skill_bank:
            self.prompt_skill_bank = self.skill_bank
        super().__post_init__()
        self.check_privileged_context()

    @property
    def credit_method(self) -> CreditMethod:
        """The registry entry `baseline` names."""
        return get_credit(self.baseline)

    def _resolve_teacher_schedule(self, method: CreditMethod) -> None:
        """Set `teacher_policy` and `teacher_sync_steps` to one consistent pair, or say which setting is wrong."""
        if self.teacher_policy is not None and self.teacher_policy not in TEACHER_POLICIES:
            raise ValueError(
                f"teacher_policy must be one of {tuple(TEACHER_POLICIES)}, got {self.teacher_policy!r}."
            )
        sync = self.teacher_sync_steps
        if sync is None:
            self.teacher_policy = self.teacher_policy or method.teacher_policy
            self.teacher_sync_steps = TEACHER_POLICIES[self.teacher_policy]
            return
        if method.teacher == "external":
            raise ValueError(
                f"teacher_sync_steps applies to self-teachers; {method.title}'s teacher is teacher_model_name_or_path, "
                "a separate frozen model. Remove teacher_sync_steps."
            )
        if isinstance(sync, bool) or not isinstance(sync, int) or sync < 0:
            raise ValueError(
                "teacher_sync_steps must be an integer >= 0 (0: never refreshed, the initial policy; 1: every step, "
                f"the rollout snapshot; N >= 2: a frozen copy refreshed every N steps), got {sync!r}."
            )
        implied = "initial" if sync == 0 else "current" if sync == 1 else "periodic"
        if self.teacher_policy not in (None, implied):
            raise ValueError(
                f"teacher_policy={self.teacher_policy!r} contradicts teacher_sync_steps={sync} (that is "
                f"{implied!r}); set only one of them."
            )
        self.teacher_policy = implied


class BaselineTrainer(AgentGRPOTrainer):
    """The comparison methods of the papers' tables, and any credit method registered in `credit.registry`, used
    exactly like `trl.GRPOTrainer` with a `BaselineConfig`.

    Args beyond `AgentGRPOTrainer`'s: `teacher_model` (OPD's teacher, overriding `teacher_model_name_or_path`),
    `analyzer` (overriding the configured PI backend) and `skill_lookup(task, task_type) -> str` for
    `pi_source="generic_skill"` (default: the top `skill_top_k` skills of `skill_bank`).
    """

    _tag_names = ["trl", "grpo", "taspo-trl", "baseline"]
    _name = "Agent baseline"

    def __init__(
        self, *args: Any, teacher_model: Any = None, analyzer: Any = None, skill_lookup: Any = None, **kwargs: Any
    ):
        config = kwargs.get("args")
        if not isinstance(config, BaselineConfig):
            raise TypeError(f"BaselineTrainer needs args=BaselineConfig(...), got {type(config).__name__}.")
        super().__init__(*args, **kwargs)
        method = self.args.credit_method
        self._name = method.title
        self._tag_names = [*self._tag_names, method.name]
        # The card links the method's own paper, not the GRPO paper inherited from TRL.
        self._paper = {"title": method.paper, "id": method.paper_id} if method.paper_id else {}
        if analyzer is None:
            writes_guidance = self.args.pi_source in ANALYZER_SOURCES or (
                method.step_skills and self.args.opid_max_step_skills > 0)
            analyzer = make_analyzer(self.args, self.environment_name, needed=method.teacher == "self" and writes_guidance)
        self.analyzer = analyzer
        self.skill_lookup = skill_lookup if skill_lookup is not None else configured_skill_lookup(self.args)
        self.teacher_model = teacher_model
        if self.teacher_model is None and self._needs_frozen_copy():
            self.teacher_model = self._load_frozen(self.args.teacher_model_name_or_path or self.model.config._name_or_path)
        # The copy is not checkpointed: a run resumed past step N refreshes it from the resumed policy at its first
        # step, and from then on it follows the schedule again.
        self._teacher_version = 0
        if self._periodic_teacher():
            if self.teacher_model is None:  # PEFT: a second adapter holds the teacher's copy of the policy's
                self._add_teacher_adapter()
            self._refresh_teacher()

    # ---- teachers ------------------------------------------------------------------------------------------

    def _is_peft(self) -> bool:
        return hasattr(self.accelerator.unwrap_model(self.model), "peft_config")

    def _periodic_teacher(self) -> bool:
        return self.args.credit_method.teacher == "self" and self.args.teacher_sync_steps >= 2

    def _needs_frozen_copy(self) -> bool:
        args = self.args
        teacher = args.credit_method.teacher
        if teacher == "external":
            return True
        if teacher is None or args.teacher_sync_steps == 1 or self._is_peft():
            return False
        # The initial policy may already be TRL's reference model; a periodic teacher needs a copy of its own.
        return self._periodic_teacher() or self.ref_model is None

    def _add_teacher_adapter(self) -> None:
        """A frozen adapter next to the policy's, as TRL adds its "ref" adapter (``_refresh_teacher`` fills it)."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        unwrapped.add_adapter(_TEACHER_ADAPTER, unwrapped.peft_config["default"])
        for name, param in unwrapped.named_parameters():
            if f".{_TEACHER_ADAPTER}." in name:
                param.requires_grad_(False)

    def _refresh_teacher(self) -> None:
        """Copy the policy's weights (its adapter, under PEFT) into the periodic teacher, through TRL's reference
        model sync with mixing weight 1, which gathers ZeRO-3 shards."""
        policy = self.accelerator.unwrap_model(self.model)
        if self.teacher_model is not None:
            SyncRefModelCallback.sync_target_model(policy, self.teacher_model, alpha=1.0)
            return
        names = [name for name, _ in policy.named_parameters() if ".default." in name]
        # ParameterLists hold the very parameters, so the sync writes into the teacher adapter in place.
        source = torch.nn.ParameterList([policy.get_parameter(name) for name in names])
        target = torch.nn.ParameterList(
            [policy.get_parameter(name.replace(".default.", f".{_TEACHER_ADAPTER}.")) for name in names]
        )
        SyncRefModelCallback.sync_target_model(source, target, alpha=1.0)

    def _sync_teacher(self) -> None:
        """Refresh a periodic teacher when the step has reached a newer ``teacher_version`` than the one it holds."""
        if not self._periodic_teacher():
            return
        version = teacher_version(self.state.global_step, self.args.teacher_sync_steps)
        if version != self._teacher_version:
            self._refresh_teacher()
            self._teacher_version = version
        self._metrics[self.metrics_mode]["baseline/teacher_version"].append(float(version))

    def _load_frozen(self, name_or_path: str) -> Any:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl.models import prepare_deepspeed
        from trl.trainer.utils import add_fused_lm_head

        from ..warmstart import resolve_policy_path

        path = resolve_policy_path(name_or_path)
        if self.args.credit_method.teacher == "external" and AutoTokenizer.from_pretrained(path).get_vocab() != self._tokenizer.get_vocab():
            raise ValueError(
                f"OPD's teacher {name_or_path!r} has a different tokenizer from the policy; the sampled-token "
                "reverse KL needs the same vocabulary (e.g. Qwen2.5-7B-Instruct as teacher of Qwen2.5-3B-Instruct)."
            )
        dtype = next(self.accelerator.unwrap_model(self.model).parameters()).dtype
        teacher = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval().requires_grad_(False)
        # TRL's log-prob function reads log-probs from a fused LM head, patched on like on its reference model.
        add_fused_lm_head(teacher, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(teacher, self.accelerator)
        return self.accelerator.prepare_model(teacher, evaluation_mode=True)

    def _teacher_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
        """log pi_T of the last ``logits_to_keep`` tokens: the frozen teacher, the initial policy, or the snapshot."""
        device = self.accelerator.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        sync = self.args.teacher_sync_steps
        if self.teacher_model is not None or (self.ref_model is not None and sync == 0):
            model = self.teacher_model if self.teacher_model is not None else self.ref_model
            with dropout_off(model):  # a teacher passed in (OPD's, or the policy itself) may be in train mode
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=self.rescore_batch_size
                )
            return logps
        if sync != 1:  # PEFT: the periodic teacher's adapter, or the initial policy (the adapter switched off)
            unwrapped = self.accelerator.unwrap_model(self.model)
            initial = "ref" if "ref" in unwrapped.peft_config else None
            with use_adapter(unwrapped, adapter_name=_TEACHER_ADAPTER if sync >= 2 else initial):
                return self._snapshot_logprobs(input_ids, attention_mask, logits_to_keep)
        return self._snapshot_logprobs(input_ids, attention_mask, logits_to_keep)

    def _turn_contexts(self, trajectories: list[Trajectory], contexts: list[str]) -> dict[tuple[int, int], str]:
        """Each turn of a trajectory with a context, under that context (OPD: every turn, under none)."""
        plain_teacher = self.args.credit_method.teacher == "external"
        return {
            (i, t): contexts[i]
            for i, trajectory in enumerate(trajectories)
            if plain_teacher or contexts[i]
            for t in range(trajectory.num_turns)
        }

    def _teacher_scores(
        self, trajectories: list[Trajectory], contexts: dict[tuple[int, int], str]
    ) -> dict[tuple[int, int], torch.Tensor]:
        """log pi_T(y_t | context + h_t) on every response token of each (trajectory, turn) of ``contexts``; an
        empty context scores under the plain prompt (OPD's teacher). Batched and padded like the rescoring of TASPO
        so every process runs the same number of forward passes."""
        keys, pairs = [], []
        for (i, t), context in contexts.items():
            trajectory = trajectories[i]
            turn = trajectory.turns[t]
            if not turn.response_ids:
                continue
            prompt = privileged_prompt_ids(trajectory, t, context, self.chat) if context else turn.prompt_ids
            keys.append((i, t))
            pairs.append((prompt, turn.response_ids))
        scored = score_continuations(
            pairs,
            self._teacher_logprobs,
            self._tokenizer.pad_token_id,
            min_rows=self._max_over_processes(len(pairs)),
            batch_size=self.rescore_batch_size,
        )
        return dict(zip(keys, scored))

    def _teacher_gaps(
        self,
        trajectories: list[Trajectory],
        contexts: dict[tuple[int, int], str],
        plain: dict[tuple[int, int], torch.Tensor],
        metric: str = "baseline/non_finite_gap_turns",
    ) -> dict[tuple[int, int], torch.Tensor]:
        """Delta_t = log pi_T(y_t | context + h_t) - log pi_old(y_t | h_t) of the turns ``_teacher_scores`` scores;
        ``plain`` holds log pi_old per (trajectory, turn), the trainer's one plain reference (``_plain_logprobs``),
        so the student term comes from the same forward as the teacher's. Turns left out for a non-finite value
        are counted in ``metric``."""
        gaps, non_finite = {}, 0
        for (i, t), teacher in self._teacher_scores(trajectories, contexts).items():
            gap = teacher.float() - plain[(i, t)]
            if torch.isfinite(gap).all():
                gaps[(i, t)] = gap
            else:  # a NaN/inf log-prob on either side leaves the turn unscored rather than poisoning the batch
                non_finite += 1
        if non_finite:
            logger.warning("%d turns had non-finite teacher gaps and keep their outcome advantage", non_finite)
        self._metrics[self.metrics_mode][metric].append(float(non_finite))
        return gaps

    # ---- credit --------------------------------------------------------------------------------------------

    def turn_advantages(self, step: StepView) -> TurnCredit:
        """The per-turn advantages of the credit method `baseline` names (``credit.registry``)."""
        method = self.args.credit_method
        if method.teacher is None:
            out = self._outcome_credit(method, step)
        else:
            out = self._teacher_credit(method, step)
        if method.metrics is not None:
            metrics = self._metrics[step.mode]
            for name, value in method.metrics(self.args, self.state.global_step).items():
                metrics[name].append(value)
        return out

    def _outcome_credit(self, method: CreditMethod, step: StepView) -> TurnCredit:
        """A teacher-free method on the batch of all processes (GiGPO's anchor-state groups span a task group's
        siblings, which may sit on other processes); this process keeps its own trajectories' share."""
        everything = step.everything
        outcome = OutcomeBatch(
            advantages=step.batch_advantages.to(torch.float32),
            observations=[[t.initial_observation] + [turn.observation for turn in t.turns[:-1]] for t in everything],
            rewards=[[turn.reward for turn in t.turns] for t in everything],
            groups=[t.group for t in everything],
        )
        credit = method.fn(outcome, self.args, self.state.global_step)
        return TurnCredit(credit[step.local])

    def _guidance(self, step: StepView, method: CreditMethod) -> Guidance:
        """The teacher's privileged context of this process's trajectories of ``step``: none for an external
        teacher (it reads the plain prompt)."""
        if method.teacher == "external":
            return Guidance([""] * len(step.trajectories), [{} for _ in step.trajectories], {})
        args = self.args
        mode = step.mode
        guidance = build_privileged_context(
            step.everything,
            step.local,
            args,
            self.analyzer,
            self.skill_lookup,
            self.accelerator,
            self._tokenizer,
            self.num_generations if mode == "train" else self.num_generations_eval,
            seed=args.seed + self.state.global_step,
            max_step_skills=args.opid_max_step_skills if method.step_skills else 0,
        )
        for name, value in guidance.metrics.items():
            self._metrics[mode][name].append(value)
        return guidance

    def _privileged_info(self, step: StepView) -> list[str]:
        """The teacher's privileged context of this process's trajectories of ``step`` (identical on every
        process)."""
        return self._guidance(step, self.args.credit_method).texts

    def _teacher_credit(self, method: CreditMethod, step: StepView) -> TurnCredit:
        """Score every turn under the teacher, then call the method once per trajectory on its gaps."""
        trajectories, advantages = step.trajectories, step.advantages
        metrics = self._metrics[step.mode]
        contexts, step_skills, _ = self._guidance(step, method)
        self.last_step.privileged_info, self.last_step.step_skills = contexts, step_skills
        self._sync_teacher()
        turn_contexts = self._turn_contexts(trajectories, contexts)
        step_contexts = (
            {(i, t): text for i, skills in enumerate(step_skills) for t, text in skills.items()} if method.step_skills else {}
        )
        # The plain side of a gap, and the student term of every turn of a trajectory with a gap: the rows of the
        # other trajectories (a group without a success has no context) are never read, so they are not scored.
        teacher_scored = {i for i, _ in [*turn_contexts, *step_contexts]}
        needed = [r for r, traj in enumerate(step.rows.row_trajectory) if traj in teacher_scored]
        plain = step.rows.collect(self._plain_logprobs(step, needed, self._max_over_processes(len(needed))))
        gaps = self._teacher_gaps(trajectories, turn_contexts, plain)
        if gaps:
            flat = torch.cat(list(gaps.values()))
            metrics["baseline/teacher_gap_mean"].append(flat.mean().item())
        metrics["baseline/teacher_coverage"].append(len({i for i, _ in gaps}) / max(len(trajectories), 1))
        step_gaps: dict[tuple[int, int], torch.Tensor] = {}
        if method.step_skills:  # every process scores (maybe nothing), so the padded forward passes stay in step
            step_gaps = self._teacher_gaps(trajectories, step_contexts, plain, "baseline/non_finite_step_gap_turns")
            turns = sum(t.num_turns for t in trajectories)
            metrics["baseline/opid_step_skill_turns"].append(len(step_gaps) / max(turns, 1))

        out = TurnCredit()
        for i, trajectory in enumerate(trajectories):
            turn_gaps = [gaps.get((i, t)) for t in range(trajectory.num_turns)]
            turn_step_gaps = [step_gaps.get((i, t)) for t in range(trajectory.num_turns)]
            # A turn the teacher did not score keeps the outcome advantage (distillation-only methods: none).
            unscored = float(advantages[i]) if method.outcome else 0.0
            if all(g is None for g in turn_gaps + turn_step_gaps):
                out.append([unscored] * trajectory.num_turns)
                continue
            lengths = [len(turn.response_ids) for turn in trajectory.turns]
            delta, mask = _stack_turns(turn_gaps, lengths)
            step_delta, step_mask = _stack_turns(turn_step_gaps, lengths)
            mask = torch.maximum(mask, step_mask)  # OPID: a turn with only one of its two gaps has 0 for the other
            student, _ = _stack_turns([plain.get((i, t)) for t in range(trajectory.num_turns)], lengths)
            trajectory_gaps = TeacherGaps(
                advantage=torch.full((delta.size(0),), float(advantages[i])),
                delta=delta,
                mask=mask,
                student=student,
                step_delta=step_delta,
            )
            shaped = method.fn(trajectory_gaps, self.args, self.state.global_step)
            out.append([shaped[t, : int(mask[t].sum())].tolist() if mask[t].any() else unscored for t in range(len(turn_gaps))])
        return out


def _stack_turns(gaps: list[torch.Tensor | None], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[turns, T] per-token values (gaps, log-probs) and mask; a turn without values (no context, empty response)
    is masked out entirely."""
    width = max(lengths) if lengths else 0
    delta = torch.zeros(len(gaps), width)
    mask = torch.zeros(len(gaps), width)
    for t, gap in enumerate(gaps):
        if gap is not None:
            delta[t, : len(gap)] = gap
            mask[t, : len(gap)] = 1.0
    return delta, mask
