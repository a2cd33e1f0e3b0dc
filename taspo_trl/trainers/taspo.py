"""TASPO: trajectory-aligned privileged information turned into bounded, mean-one action weights on the GRPO
outcome advantage (Algorithm 1). Only the credit hook differs from the GRPO baseline:

1. PI per trajectory from the verified successful siblings of its group (Sec. 3.2, A.2), built once per group on
   the main process from all processes' trajectories and broadcast, so every process uses identical PI;
2. paired rescoring of the sampled responses with and without P_i by the frozen rollout snapshot (Eq. 3);
3. clipped action scores (Eq. 4), support (Eq. 5) and weights (Eq. 6), with the A.3 fallbacks.
"""

from __future__ import annotations

import logging
import os
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from ..credit.taspo import clipped_action_score, taspo_fallback_reason, taspo_token_weights, taspo_weights
from ..privileged import PI_SOURCES, OpenAICompatibleAnalyzer, RuleBasedAnalyzer, TransformersAnalyzer, build_batch
from ..privileged.analyzers import REASONING_MODES, REASONING_PARAMS, reasoning_request_fields
from ..privileged.rescoring import privileged_token_shifts, rescored_rows
from ..rollout.layouts import Rows
from ..rollout.records import Trajectory
from .grpo import AgentGRPOConfig, AgentGRPOTrainer

logger = logging.getLogger(__name__)

ANALYZERS = ("rule", "openai", "transformers")


@dataclass
class TASPOConfig(AgentGRPOConfig):
    r"""Configuration of [`TASPOTrainer`]: every field of [`AgentGRPOConfig`] (and so of `trl.GRPOConfig`), plus
    TASPO's settings. Defaults are the paper's (Appendix A.2, Table C.3).

    Parameters:
        c_delta (`float`, defaults to `2.0`): $c_\Delta$, the token-shift clip of Eq. 4 / A.1.
        tau (`float`, defaults to `0.5`): $\tau$, the score temperature of Eq. 5.
        eps_w (`float`, defaults to `0.4`): $\epsilon_w$, the weight range of Eq. 1 / 6 (weights in $[1-\epsilon_w, 1+\epsilon_w]$).
        kappa (`float` or `None`, defaults to `None`): $\kappa$, small-shift threshold. Table C.3 lists 0.05 but
            A.3 says no small-magnitude filter is applied; off by default (docs/methods.md), set it to reproduce C.3.
        allocation_unit (`str`, defaults to `"action"`): `"action"` (one weight per turn, TASPO) or `"token"`
            (Table 4's token-level ablation: each action token gets its own weight, other tokens 1).
        pi_source (`str`, defaults to `"aligned"`): PI construction (Table 2): `"aligned"`, `"nearest_success"`,
            `"random_success"` or `"generic_skill"` (needs a `skill_lookup` passed to the trainer); also
            `"success_skills"`, the analyzer's items from the other successes without alignment (Skill-SD's).
        analyzer (`str`, defaults to `"rule"`): `"rule"` (deterministic rule-based, offline; ALFWorld, WebShop and
            Search-QA), `"openai"` (any OpenAI-compatible server: DeepSeek, vLLM, `transformers serve`; the paper's
            setting) or `"transformers"` (a local model, `analyzer_model`).
        analyzer_model (`str` or `None`): model name for `"openai"`, path or id for `"transformers"`.
        analyzer_base_url (`str` or `None`): endpoint of the OpenAI-compatible server.
        analyzer_api_key_env (`str`, defaults to `"OPENAI_API_KEY"`): environment variable holding the API key;
            for `"openai"` it must be set (`""`: the server needs no key, e.g. a local vLLM).
        analyzer_max_tokens (`int`, defaults to `4096`): analyzer output limit (C.3).
        analyzer_workers (`int`, defaults to `4`): concurrent analyzer requests (C.3).
        analyzer_timeout (`float`, defaults to `60.0`): seconds per analyzer request.
        analyzer_max_retries (`int`, defaults to `2`): retries of a failed request.
        analyzer_cache_dir (`str` or `None`): disk cache of analyzer answers (reruns and resumes reproduce PI);
            `None` = `<output_dir>/analyzer_cache` for the `"openai"` analyzer.
        analyzer_reasoning (`str`, defaults to `"off"`): the analyzer's reasoning ("thinking") mode, off as in the
            paper (C.3): `"off"`, `"on"`, or `"server_default"` (send nothing; for servers that refuse unknown
            request fields, such as the OpenAI API). The `"transformers"` analyzer passes it to the chat template
            as `enable_thinking`; the rule-based one does not reason.
        analyzer_reasoning_param (`str`, defaults to `"thinking"`): how the `"openai"` analyzer's requests carry
            it: `"thinking"` (DeepSeek: `{"thinking": {"type": "disabled"}}`) or `"chat_template_kwargs"` (vLLM,
            SGLang, `transformers serve` with Qwen3-style templates: `{"chat_template_kwargs": {"enable_thinking":
            false}}`).
        analyzer_extra_body (`dict`, JSON string or `None`): more fields for every `"openai"` analyzer request
            body, merged over the reasoning fields (its keys win), e.g. `{"reasoning_effort": "minimal"}`.
        pi_char_budget (`int`, defaults to `12000`): $C$, the character budget of an analyzer request (A.2).
        pi_max_items (`int`, defaults to `12`): maximum evidence items (C.3).
        pi_max_statements (`int`, defaults to `8`): $G$: P_i is composed from the accepted statements among the
            analyzer's first $G$ candidates (A.2).
        pi_token_budget (`int`, defaults to `256`): $B_{PI}$, the PI token budget (A.2).
    """

    c_delta: float = field(default=2.0, metadata={"help": "c_Delta: token-shift clip (Eq. 4)."})
    tau: float = field(default=0.5, metadata={"help": "tau: score temperature (Eq. 5)."})
    eps_w: float = field(default=0.4, metadata={"help": "epsilon_w: weight range (Eq. 6)."})
    kappa: float | None = field(default=None, metadata={"help": "kappa: small-shift threshold (C.3; off per A.3)."})
    allocation_unit: str = field(default="action", metadata={"help": "'action' (TASPO) or 'token' (Table 4)."})
    pi_source: str = field(default="aligned", metadata={"help": "PI construction (Table 2)."})
    analyzer: str = field(default="rule", metadata={"help": "'rule', 'openai' or 'transformers'."})
    analyzer_model: str | None = field(default=None, metadata={"help": "Analyzer model name/path."})
    analyzer_base_url: str | None = field(default=None, metadata={"help": "OpenAI-compatible endpoint."})
    analyzer_api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "Env var with the API key."})
    analyzer_max_tokens: int = field(default=4096, metadata={"help": "Analyzer output limit."})
    analyzer_workers: int = field(default=4, metadata={"help": "Concurrent analyzer requests."})
    analyzer_timeout: float = field(default=60.0, metadata={"help": "Seconds per analyzer request."})
    analyzer_max_retries: int = field(default=2, metadata={"help": "Retries per analyzer request."})
    analyzer_cache_dir: str | None = field(default=None, metadata={"help": "Disk cache of analyzer answers."})
    analyzer_reasoning: str = field(default="off", metadata={"help": "'off' (paper), 'on' or 'server_default'."})
    analyzer_reasoning_param: str = field(
        default="thinking", metadata={"help": "Request field for it: 'thinking' or 'chat_template_kwargs'."}
    )
    analyzer_extra_body: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Extra JSON fields of every openai analyzer request."}
    )
    pi_char_budget: int = field(default=12000, metadata={"help": "C: analyzer request character budget."})
    pi_max_items: int = field(default=12, metadata={"help": "Maximum evidence items."})
    pi_max_statements: int = field(default=8, metadata={"help": "G: candidate statements composed into PI."})
    pi_token_budget: int = field(default=256, metadata={"help": "B_PI: PI token budget."})

    # TrainingArguments parses these from JSON strings (command line) in its __post_init__.
    _VALID_DICT_FIELDS = [*AgentGRPOConfig._VALID_DICT_FIELDS, "analyzer_extra_body"]

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.analyzer_reasoning, bool):  # YAML reads a bare off / on as false / true
            self.analyzer_reasoning = "on" if self.analyzer_reasoning else "off"
        if self.analyzer_reasoning not in REASONING_MODES:
            raise ValueError(f"analyzer_reasoning must be one of {REASONING_MODES}, got {self.analyzer_reasoning!r}.")
        if self.analyzer_reasoning_param not in REASONING_PARAMS:
            raise ValueError(
                f"analyzer_reasoning_param must be one of {REASONING_PARAMS}, got {self.analyzer_reasoning_param!r}."
            )
        if self.analyzer_extra_body is not None and not isinstance(self.analyzer_extra_body, dict):
            raise ValueError(
                f"analyzer_extra_body must be a JSON object, e.g. '{{\"reasoning_effort\": \"minimal\"}}', got "
                f"{self.analyzer_extra_body!r}."
            )
        if self.allocation_unit not in ("action", "token"):
            raise ValueError(f"allocation_unit must be 'action' or 'token', got {self.allocation_unit!r}.")
        if self.pi_source not in PI_SOURCES:
            raise ValueError(f"pi_source must be one of {PI_SOURCES}, got {self.pi_source!r}.")
        if self.analyzer not in ANALYZERS:
            raise ValueError(f"analyzer must be one of {ANALYZERS}, got {self.analyzer!r}.")
        if self.analyzer == "openai" and not (self.analyzer_base_url and self.analyzer_model):
            raise ValueError(
                "analyzer='openai' needs analyzer_base_url (e.g. https://api.deepseek.com or "
                "http://127.0.0.1:8000/v1) and analyzer_model."
            )
        if self.analyzer == "openai" and self.analyzer_api_key_env and not os.environ.get(self.analyzer_api_key_env):
            raise ValueError(
                f"analyzer='openai' reads its API key from ${self.analyzer_api_key_env}, which is not set: export "
                "it, or set analyzer_api_key_env to '' for a server that needs no key (vLLM, transformers serve)."
            )
        if self.analyzer == "transformers" and not self.analyzer_model:
            raise ValueError("analyzer='transformers' needs analyzer_model (a local path or model id).")
        if not (self.tau > 0 and 0 <= self.eps_w < 1 and self.c_delta > 0):
            raise ValueError(f"need tau > 0, 0 <= eps_w < 1, c_delta > 0; got {self.tau}, {self.eps_w}, {self.c_delta}.")


def make_analyzer(args: TASPOConfig) -> Any:
    """The configured analyzer backend (A.2)."""
    if args.analyzer == "rule":
        return RuleBasedAnalyzer()
    if args.analyzer == "transformers":
        return TransformersAnalyzer(
            args.analyzer_model, max_new_tokens=args.analyzer_max_tokens, reasoning=args.analyzer_reasoning
        )
    return OpenAICompatibleAnalyzer(
        base_url=args.analyzer_base_url,
        model=args.analyzer_model,
        api_key=os.environ.get(args.analyzer_api_key_env),
        temperature=0.0,
        max_tokens=args.analyzer_max_tokens,
        timeout=args.analyzer_timeout,
        max_retries=args.analyzer_max_retries,
        workers=args.analyzer_workers,
        cache_dir=args.analyzer_cache_dir or os.path.join(args.output_dir, "analyzer_cache"),
        extra_body={
            **reasoning_request_fields(args.analyzer_reasoning, args.analyzer_reasoning_param),
            **(args.analyzer_extra_body or {}),
        },
    )


class TASPOTrainer(AgentGRPOTrainer):
    """TASPO (trajectory-aligned privileged credit). Used exactly like `trl.GRPOTrainer`, with a `TASPOConfig`.

    Args beyond `AgentGRPOTrainer`'s: `analyzer` (an object with `complete(messages) -> str` and `workers`,
    overriding the configured backend) and `skill_lookup(task, task_type) -> str` for `pi_source="generic_skill"`.
    """

    _tag_names = ["trl", "grpo", "taspo-trl", "taspo"]
    _name = "TASPO"
    _paper = {
        "title": "Reconciling Process Supervision with Outcome-Based Credit in Agentic Policy Optimization",
        "citation": textwrap.dedent("""\
            @article{taspo,
                title  = {{Reconciling Process Supervision with Outcome-Based Credit in Agentic Policy Optimization}},
                note   = {TASPO},
            }"""),
    }

    def __init__(self, *args: Any, analyzer: Any = None, skill_lookup: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, TASPOConfig):
            raise TypeError(f"TASPOTrainer needs a TASPOConfig, got {type(self.args).__name__}.")
        if self.args.pi_source == "generic_skill" and skill_lookup is None:
            raise ValueError("pi_source='generic_skill' needs skill_lookup=callable(task, task_type) -> str.")
        self.analyzer = analyzer if analyzer is not None else make_analyzer(self.args)
        self.skill_lookup = skill_lookup
        self.last_privileged_info: list[str] = []
        self.last_weights: list[list[float | list[float]]] = []

    def turn_weights(
        self, trajectories: list[Trajectory], advantages: torch.Tensor, rows: Rows, batch: dict[str, Any]
    ) -> list[list[float | list[float]]]:
        args = self.args
        mode = "train" if self.model.training else "eval"
        metrics = self._metrics[mode]

        pi_texts = self._privileged_info(trajectories)
        usable = [pi if float(a) != 0.0 else "" for pi, a in zip(pi_texts, advantages.tolist())]

        started = time.perf_counter()
        shifts = privileged_token_shifts(
            rows,
            trajectories,
            usable,
            self.chat,
            self._snapshot_logprobs,
            self._plain_logprobs(rows, batch),
            self._tokenizer.pad_token_id,
            min_rows=self._max_over_processes(len(rescored_rows(rows, usable))),
            batch_size=self.rescore_batch_size,
        )
        metrics["taspo/rescoring_seconds"].append(time.perf_counter() - started)

        weights: list[list[float | list[float]]] = []
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

        self.last_privileged_info, self.last_weights = pi_texts, weights
        for reason in ("redistributed", "no_pi", "zero_advantage", "few_scorable"):
            metrics[f"taspo/fallback/{reason}"].append(reasons[reason] / max(len(trajectories), 1))
        metrics["taspo/scorable_turn_fraction"].append(scorable / max(total_turns, 1))
        if abs_scores:
            metrics["taspo/mean_abs_score"].append(sum(abs_scores) / len(abs_scores))
        flat = torch.tensor([v for traj in weights for turn in traj for v in (turn if isinstance(turn, list) else [turn])])
        if flat.numel():
            metrics["taspo/weight_mean"].append(flat.mean().item())
            metrics["taspo/weight_std"].append(flat.std().item() if flat.numel() > 1 else 0.0)
        return weights

    def _token_weights(
        self, trajectory: Trajectory, per_turn: list[torch.Tensor | None], advantage: float, has_pi: bool
    ) -> list[float | list[float]]:
        """Table 4's token-level unit: action tokens get their own weights, the turn's other tokens 1."""
        args = self.args
        span_weights = taspo_token_weights(per_turn, advantage, args.c_delta, args.tau, args.eps_w, args.kappa, has_pi=has_pi)
        out: list[float | list[float]] = []
        for turn, w in zip(trajectory.turns, span_weights):
            start, end = turn.action_span
            if w.numel() == 0:
                out.append(1.0)
                continue
            token_w = [1.0] * len(turn.response_ids)
            token_w[start:end] = w.tolist()
            out.append(token_w)
        return out

    def _privileged_info(self, trajectories: list[Trajectory]) -> list[str]:
        """PI for this process's trajectories (see ``_guidance``)."""
        return self._guidance(trajectories)[0]

    def _guidance(
        self, trajectories: list[Trajectory], max_step_skills: int = 0
    ) -> tuple[list[str], list[dict[int, str]]]:
        """PI and, with ``max_step_skills`` > 0, step skills (by step index) for this process's trajectories.
        Groups may straddle processes, so the main process builds them for the gathered batch once and broadcasts
        them (every process then uses identical PI)."""
        args = self.args
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        everything = gather_object(trajectories) if self.accelerator.num_processes > 1 else list(trajectories)
        payload: list[Any] = [None]
        if self.accelerator.is_main_process:
            built = build_batch(
                everything,
                group_size,
                self.analyzer,
                self._tokenizer,
                source=args.pi_source,
                char_budget=args.pi_char_budget,
                max_items=args.pi_max_items,
                max_statements=args.pi_max_statements,
                token_budget=args.pi_token_budget,
                skill_lookup=self.skill_lookup,
                max_step_skills=max_step_skills,
                seed=args.seed + self.state.global_step,
            )
            payload = [(built.texts, built.step_skills, built.stats.as_metrics("pi/"))]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        texts, step_skills, pi_metrics = payload[0]
        for name, value in pi_metrics.items():
            self._metrics[mode][name].append(value)
        start = self.accelerator.process_index * len(trajectories)
        mine = slice(start, start + len(trajectories))
        return texts[mine], step_skills[mine]
