"""TASPO: trajectory-aligned privileged information turned into bounded, mean-one action weights on the GRPO
outcome advantage (Algorithm 1). Only the credit hook differs from the GRPO baseline:

1. PI per trajectory from the verified successful siblings of its group (Sec. 3.2, A.2), built once per group on
   the main process from all processes' trajectories and broadcast, so every process uses identical PI;
2. paired rescoring of the sampled responses with and without P_i by the frozen rollout snapshot (Eq. 3);
3. clipped action scores (Eq. 4), support (Eq. 5) and weights (Eq. 6), with the A.3 fallbacks.
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ..credit.taspo import clipped_action_score, taspo_fallback_reason, taspo_token_weights, taspo_weights
from ..credit.turns import TurnCredit, TurnValue
from ..privileged.builder import ANALYZER_SOURCES
from ..privileged.context import (
    PRIVILEGED_DICT_FIELDS,
    PrivilegedContextConfig,
    build_privileged_context,
    configured_skill_lookup,
    make_analyzer,
)
from ..rollout.records import Trajectory
from .grpo import AgentGRPOConfig, AgentGRPOTrainer
from .step import StepView

logger = logging.getLogger(__name__)


@dataclass
class TASPOConfig(AgentGRPOConfig, PrivilegedContextConfig):
    r"""Configuration of [`TASPOTrainer`]: every field of [`AgentGRPOConfig`] (and so of `trl.GRPOConfig`) and of
    [`PrivilegedContextConfig`] (the PI source and analyzer: `pi_source`, `analyzer*`, `pi_*` budgets), plus
    TASPO's settings. Defaults are the paper's (Appendix A.2, Table C.3).

    Parameters:
        c_delta (`float`, defaults to `2.0`): $c_\Delta$, the token-shift clip of Eq. 4 / A.1.
        tau (`float`, defaults to `0.5`): $\tau$, the score temperature of Eq. 5.
        eps_w (`float`, defaults to `0.4`): $\epsilon_w$, the weight range of Eq. 1 / 6 (weights in $[1-\epsilon_w, 1+\epsilon_w]$).
        kappa (`float` or `None`, defaults to `None`): $\kappa$, small-shift threshold. Table C.3 lists 0.05 but
            A.3 says no small-magnitude filter is applied; off by default (docs/methods.md), set it to reproduce C.3.
        allocation_unit (`str`, defaults to `"action"`): `"action"` (one weight per turn, TASPO) or `"token"`
            (Table 4's token-level ablation: each action token gets its own weight, other tokens 1).
    """

    c_delta: float = field(default=2.0, metadata={"help": "c_Delta: token-shift clip (Eq. 4)."})
    tau: float = field(default=0.5, metadata={"help": "tau: score temperature (Eq. 5)."})
    eps_w: float = field(default=0.4, metadata={"help": "epsilon_w: weight range (Eq. 6)."})
    kappa: float | None = field(default=None, metadata={"help": "kappa: small-shift threshold (C.3; off per A.3)."})
    allocation_unit: str = field(default="action", metadata={"help": "'action' (TASPO) or 'token' (Table 4)."})

    # TrainingArguments parses these from JSON strings (command line) in its __post_init__.
    _VALID_DICT_FIELDS = [*AgentGRPOConfig._VALID_DICT_FIELDS, *PRIVILEGED_DICT_FIELDS]

    def __post_init__(self):
        super().__post_init__()
        self.check_privileged_context()
        if self.allocation_unit not in ("action", "token"):
            raise ValueError(f"allocation_unit must be 'action' or 'token', got {self.allocation_unit!r}.")
        if not (self.tau > 0 and 0 <= self.eps_w < 1 and self.c_delta > 0):
            raise ValueError(f"need tau > 0, 0 <= eps_w < 1, c_delta > 0; got {self.tau}, {self.eps_w}, {self.c_delta}.")


class TASPOTrainer(AgentGRPOTrainer):
    """TASPO (trajectory-aligned privileged credit). Used exactly like `trl.GRPOTrainer`, with a `TASPOConfig`.

    Args beyond `AgentGRPOTrainer`'s: `analyzer` (an object with `complete(messages) -> str` and `workers`,
    overriding the configured backend) and `skill_lookup(task, task_type) -> str` for `pi_source="generic_skill"`
    (default: the top `skill_top_k` skills of `skill_bank`).
    """

    _tag_names = ["trl", "grpo", "taspo-trl", "taspo"]
    _name = "TASPO"
    _paper = {
        "title": "Reconciling Process Supervision with Outcome-Based Credit in Agentic Policy Optimization",
        "citation": textwrap.dedent("""\
            @misc{taspo2026,
                title  = {{Reconciling Process Supervision with Outcome-Based Credit in Agentic Policy Optimization}},
                year   = {2026},
                note   = {TASPO; preprint},
            }"""),
    }

    def __init__(self, *args: Any, analyzer: Any = None, skill_lookup: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, TASPOConfig):
            raise TypeError(f"TASPOTrainer needs a TASPOConfig, got {type(self.args).__name__}.")
        if analyzer is None:
            analyzer = make_analyzer(self.args, self.environment_name, needed=self.args.pi_source in ANALYZER_SOURCES)
        self.analyzer = analyzer
        self.skill_lookup = skill_lookup if skill_lookup is not None else configured_skill_lookup(self.args)

    def turn_weights(self, step: StepView) -> TurnCredit:
        """TASPO's weight of each turn: Eq. 4-6 on the privileged shifts of its action, or 1 (the A.3 fallbacks).
        ``last_step`` keeps the PI and the weights."""
        args = self.args
        trajectories, advantages = step.trajectories, step.advantages
        mode = step.mode
        metrics = self._metrics[mode]

        pi_texts = self._privileged_info(step)
        usable = [pi if float(a) != 0.0 else "" for pi, a in zip(pi_texts, advantages.tolist())]

        started = time.perf_counter()
        shifts, _ = self._privileged_shifts(step, usable)
        metrics["taspo/rescoring_seconds"].append(time.perf_counter() - started)

        weights = TurnCredit()
        reasons: Counter = Counter()
        scorable = total_turns = 0
        abs_scores = []
        for i, trajectory in enumerate(trajectories):
            advantage = float(advantages[i])
            per_turn = [shifts.get((i, t)) for t in range(trajectory.num_turns)]
            has_pi = bool(pi_texts[i])
            if args.allocation_unit == "token":
                weights.append(self._token_weights(trajectory, per_turn, advantage, has_pi))
                reason = None
            else:
                scores = [None if s is None else clipped_action_score(s, args.c_delta, args.kappa) for s in per_turn]
                w = taspo_weights(scores, advantage, args.tau, args.eps_w, has_pi=has_pi)
                weights.append(w.tolist())
                reason = taspo_fallback_reason(scores, advantage, has_pi=has_pi)
                scorable += sum(s is not None for s in scores)
                abs_scores += [abs(s) for s in scores if s is not None]
            total_turns += trajectory.num_turns
            reasons[reason or "redistributed"] += 1

        self.last_step.privileged_info, self.last_step.weights = pi_texts, weights
        for reason in ("redistributed", "no_pi", "zero_advantage", "few_scorable"):
            metrics[f"taspo/fallback/{reason}"].append(reasons[reason] / max(len(trajectories), 1))
        metrics["taspo/scorable_turn_fraction"].append(scorable / max(total_turns, 1))
        if abs_scores:
            metrics["taspo/mean_abs_score"].append(sum(abs_scores) / len(abs_scores))
        flat = torch.tensor(weights.flat())
        if flat.numel():
            metrics["taspo/weight_mean"].append(flat.mean().item())
            metrics["taspo/weight_std"].append(flat.std().item() if flat.numel() > 1 else 0.0)
        return weights

    def _token_weights(
        self, trajectory: Trajectory, per_turn: list[torch.Tensor | None], advantage: float, has_pi: bool
    ) -> list[TurnValue]:
        """Table 4's token-level unit: action tokens get their own weights, the turn's other tokens 1."""
        args = self.args
        span_weights = taspo_token_weights(per_turn, advantage, args.c_delta, args.tau, args.eps_w, args.kappa, has_pi=has_pi)
        out: list[TurnValue] = []
        for turn, w in zip(trajectory.turns, span_weights):
            start, end = turn.action_span
            if w.numel() == 0:
                out.append(1.0)
                continue
            token_w = [1.0] * len(turn.response_ids)
            token_w[start:end] = w.tolist()
            out.append(token_w)
        return out

    def _privileged_info(self, step: StepView) -> list[str]:
        """PI for this process's trajectories of ``step``, identical on every process (``build_privileged_context``)."""
        mode = step.mode
        guidance = build_privileged_context(
            step.everything,
            step.local,
            self.args,
            self.analyzer,
            self.skill_lookup,
            self.accelerator,
            self._tokenizer,
            self.num_generations if mode == "train" else self.num_generations_eval,
            seed=self.args.seed + self.state.global_step,
        )
        for name, value in guidance.metrics.items():
            self._metrics[mode][name].append(value)
        calls = guidance.metrics.get("pi/analyzer_calls", 0.0)
        if mode == "train" and calls:
            self._guard_analyzer_errors(guidance.metrics.get("pi/analyzer_errors", 0.0) / calls, int(calls))
        return guidance.texts

    def _guard_analyzer_errors(self, rate: float, calls: int) -> None:
        """An analyzer whose calls keep failing leaves TASPO without PI (coverage 0: plain GRPO at TASPO's cost).
        Its failed-call rate is held to the environments' limit: a warning for each batch above
        ``max_env_error_rate``, and a stop, after a checkpoint, after ``env_error_patience`` such batches in a row.
        The PI, and so the rate, is the same on every process, so all decide alike."""
        args = self.args
        streak = getattr(self, "_analyzer_error_streak", 0)
        streak = streak + 1 if rate > args.max_env_error_rate else 0
        self._analyzer_error_streak = streak
        if not streak:
            return
        what = (f"{rate:.0%} of this batch's {calls} analyzer calls failed (above max_env_error_rate="
                f"{args.max_env_error_rate}), {streak} batch(es) in a row")
        if streak < args.env_error_patience:
            logger.warning("%s: those trajectories get no PI; training stops after %d such batches (env_error_patience). "
                           "The analyzer's errors are in the log above.", what, args.env_error_patience)
            return
        self._save_checkpoint(self.model, trial=None)
        raise RuntimeError(
            f"{what}: training stopped after saving checkpoint-{self.state.global_step} in {args.output_dir}, since "
            "without PI TASPO is GRPO. Check the analyzer (analyzer_base_url / analyzer_model, the server's log, or "
            "pi_source), or raise max_env_error_rate, and resume with --resume_from_checkpoint."
        )
