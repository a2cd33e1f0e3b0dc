"""The privileged context any trainer composes: its settings (``PrivilegedContextConfig``, a dataclass mixin of
the trainer configs that use it) and ``build_privileged_context``, which turns one process's trajectories into
their PI texts (and, on request, step skills).

Groups may straddle processes, so the main process builds the context for the gathered batch once and
broadcasts it: every process then uses identical PI, and each keeps the slice of its own trajectories.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from ..envs import analyzer_rules_names
from ..rollout.records import Trajectory
from .analyzers import (
    REASONING_MODES,
    REASONING_PARAMS,
    OpenAICompatibleAnalyzer,
    RuleBasedAnalyzer,
    TransformersAnalyzer,
    reasoning_request_fields,
    unknown_rule_set,
)
from .builder import PI_SOURCES, build_batch
from .skillbank import SkillBank

ANALYZERS = ("rule", "openai", "transformers")

PRIVILEGED_DICT_FIELDS = ("analyzer_extra_body",)
"""Fields that `TrainingArguments` parses from a JSON string: a config class including the mixin adds these to
its ``_VALID_DICT_FIELDS``."""


@dataclass
class PrivilegedContextConfig:
    r"""The privileged-context settings: the PI source and the analyzer backend that writes PI (TASPO Sec. 3.2,
    A.2; Table C.3), shared by every trainer that builds privileged contexts (TASPO, the comparison methods'
    teachers). A dataclass mixin: list it after the trainer config, e.g. `class C(AgentGRPOConfig,
    PrivilegedContextConfig)`, and call `check_privileged_context()` at the end of `__post_init__`. The skill bank
    of `generic_skill` contexts is `AgentGRPOConfig`'s `skill_bank` / `skill_top_k`.

    Parameters:
        pi_source (`str`, defaults to `"aligned"`): PI construction (Table 2): `"aligned"`, `"nearest_success"`,
            `"random_success"` or `"generic_skill"` (the top `skill_top_k` skills of `skill_bank`, or a
            `skill_lookup` passed to the trainer); also `"success_skills"`, the analyzer's items from the other
            successes without alignment (Skill-SD's).
        analyzer (`str`, defaults to `"rule"`): `"rule"` (deterministic rule-based, offline; environments with
            rules registered: ALFWorld, WebShop and Search-QA), `"openai"` (any OpenAI-compatible server: DeepSeek, vLLM, `transformers serve`; the paper's
            setting) or `"transformers"` (a local model, `analyzer_model`).
        analyzer_rules (`str` or `None`, defaults to `None`): the `"rule"` analyzer's rule set, the name of an
            environment with rules registered (`taspo_trl.envs.register_analyzer_rules`; `"alfworld"`, `"webshop"`
            and `"search"` have theirs); `None` = the trainer's environment. An environment of your own (registered,
            or passed as a factory) has none: register its rules, name the built-in one whose actions it uses, or
            use an LLM analyzer.
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

    pi_source: str = field(default="aligned", metadata={"help": "PI construction (Table 2)."})
    analyzer: str = field(default="rule", metadata={"help": "'rule', 'openai' or 'transformers'."})
    analyzer_rules: str | None = field(
        default=None, metadata={"help": "Rule set of the 'rule' analyzer (None: the trainer's environment's)."}
    )
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

    def check_privileged_context(self) -> None:
        """Refuse a setting the analyzer or PI builder could not run, with the fix in the message."""
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
        if self.pi_source not in PI_SOURCES:
            raise ValueError(f"pi_source must be one of {PI_SOURCES}, got {self.pi_source!r}.")
        if self.analyzer not in ANALYZERS:
            raise ValueError(f"analyzer must be one of {ANALYZERS}, got {self.analyzer!r}.")
        if self.analyzer_rules is not None and self.analyzer_rules not in analyzer_rules_names():
            raise ValueError(
                f"analyzer_rules must be one of {analyzer_rules_names()} or None, got {self.analyzer_rules!r}."
            )
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


def make_analyzer(args: Any, environment: str | None, needed: bool = True) -> Any:
    """The configured analyzer backend (A.2) of a config that includes ``PrivilegedContextConfig``, for a trainer on
    ``environment`` (a registered name; None for an environment passed as a factory). The ``"rule"`` analyzer reads
    with the rule set of ``analyzer_rules``, else of ``environment``; where it has none, a trainer that ``needed``
    an analyzer is refused with the fix, and one that did not gets None."""
    if args.analyzer == "rule":
        rules = args.analyzer_rules or environment
        if rules in analyzer_rules_names():
            return RuleBasedAnalyzer(rules)
        if needed:
            raise ValueError(unknown_rule_set(rules))
        return None
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


class Guidance(NamedTuple):
    """The privileged context of this process's trajectories, in their order."""

    texts: list[str]
    """PI per trajectory ("" where the source has none)."""
    step_skills: list[dict[int, str]]
    """Step skills per trajectory, by step index (empty unless asked for)."""
    metrics: dict[str, float]
    """The builder's statistics of the whole batch, named ``pi/...``."""


def configured_skill_lookup(args: Any) -> Any:
    """The ``generic_skill`` lookup of ``args``' `skill_bank` (its top `skill_top_k` skills), or ``None`` when
    ``args.pi_source`` needs none."""
    if args.pi_source != "generic_skill":
        return None
    return SkillBank.load(args.skill_bank, default_k=args.skill_top_k).skill_lookup


def build_privileged_context(
    everything: list[Trajectory],
    mine: slice,
    args: Any,
    analyzer: Any,
    skill_lookup: Any,
    accelerator: Accelerator,
    tokenizer: Any,
    group_size: int,
    seed: int,
    max_step_skills: int = 0,
) -> Guidance:
    """PI and, with ``max_step_skills`` > 0, step skills for this process's trajectories (``everything[mine]``), as
    ``args`` (a ``PrivilegedContextConfig``) configures them, written by ``analyzer`` (``skill_lookup(task,
    task_type)`` for `generic_skill`): built on the main process for ``everything``, the step's trajectories of all
    processes, then broadcast."""
    payload: list[Any] = [None]
    if accelerator.is_main_process:
        built = build_batch(
            everything,
            group_size,
            analyzer,
            tokenizer,
            source=args.pi_source,
            char_budget=args.pi_char_budget,
            max_items=args.pi_max_items,
            max_statements=args.pi_max_statements,
            token_budget=args.pi_token_budget,
            skill_lookup=skill_lookup,
            max_step_skills=max_step_skills,
            seed=seed,
        )
        payload = [(built.texts, built.step_skills, built.stats.as_metrics("pi/"))]
    if accelerator.num_processes > 1:
        broadcast_object_list(payload, from_process=0)
    texts, step_skills, metrics = payload[0]
    return Guidance(texts[mine], step_skills[mine], metrics)
