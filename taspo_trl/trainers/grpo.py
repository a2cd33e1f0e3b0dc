"""GRPO for multi-turn agents: TRL's ``GRPOTrainer`` with the batched agent loop and Eq. 7's loss balancing.

This is the paper's GRPO baseline and the base of ``TASPOTrainer`` / ``AlignOPSDTrainer``: TASPO overrides
``turn_weights`` (how a trajectory's outcome advantage is spread over its turns), AlignOPSD ``turn_advantages``
(its credit adds terms to the outcome advantage).

One training step, top to bottom (``_generate_and_score_completions``):
1. play one episode per dataset row with the batched agent loop (K consecutive rows = one task group);
2. score each trajectory with the reward functions (default: the environment's verified reward);
3. group-relative outcome advantages A_i over the rewards gathered from all processes (Sec. 3.1);
4. lay trajectories out as training rows, with the log-probs of the rollout snapshot / reference where TRL's
   loss needs them;
5. the credit method's per-turn weights w_it (GRPO: all ones): every policy token of turn t gets the advantage
   A_i w_it and the Eq. 7 balancing weight 1 / (T_i |R_it|), which enters TRL's ``dapo`` loss as a fractional
   token mask; then the metrics, and the batch.

TRL then cuts the batch into micro-batches (``_prepare_inputs``); when the loss allows it exactly, they are
repacked (``packing.repack``): rows whose loss is zero (with ``beta = 0``: every row whose advantages are all 0,
e.g. all rows of a group without any success) are left out of the forward and backward passes, and the rest
are grouped by length and stripped of padding.

This module holds the config and the step. The trainer's other jobs are mixins in their own modules: the no-grad
scoring passes the credit methods share (``scoring.ScoringPasses``), the repacking of micro-batches
(``packing.MicroBatchRepacking``), checkpoint saving and the model card.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import pad, use_adapter

from ..checkpoints import CheckpointSaving
from ..credit.grpo import grpo_outcome_advantages
from ..credit.normalization import turn_balanced_token_weights
from ..credit.turns import TurnCredit
from ..envs import EnvFactory, PromptTemplate, check_task_rows, get_env_factory, task_spec_from_row
from ..envs.trl_style import (
    TOOL_CALL_TAG,
    TRLStyleEnvFactory,
    keep_prompt_column,
    refuse_ignored_trainer_arguments,
    tool_call_tag,
)
from ..model_card import AgentModelCard
from ..precision import resolve_config_precision
from ..privileged.skillbank import SkillBank, add_skill_guidance
from ..rollout.chat import ChatFormat
from ..rollout.env_pool import EnvPool
from ..rollout.generation import generator_for_trainer
from ..rollout.layouts import Rows, build_rows
from ..rollout.loop import LAYOUTS, run_agent_loop
from ..rollout.records import Trajectory
from ..run_contract import (
    check_generation_batch,
    check_run_settings,
    run_length_notes,
)
from ..warmstart import resolve_policy_path
from .packing import MicroBatchRepacking
from .reward_checks import checked_reward_funcs, reward_func_list
from .sampling import EpochReplaySampler
from .scoring import ScoringPasses, vllm_importance_sampling_ratio
from .step import LastStep, StepView
from .trl_config import adopt_activation_checkpointing

logger = logging.getLogger(__name__)


@dataclass
class AgentGRPOConfig(GRPOConfig):
    r"""Configuration of [`AgentGRPOTrainer`]: every field of `trl.GRPOConfig`, plus the agent settings below.

    Parameters:
        environment (`str`, defaults to `"alfworld"`):
            Registered environment name (`taspo_trl.envs.register_env` adds yours). Ignored when the trainer
            gets an `env_factory`.
        layout (`str`, defaults to `"turn"`):
            Training-row layout: `"turn"` (one row per turn, prompt = task + last `history_window` steps; the
            paper's protocol for ALFWorld and WebShop) or `"sequence"` (one row per trajectory, exact history).
        max_turns (`int` or `None`, defaults to `None`):
            Cap on turns per episode; `None` keeps the environment's own limit (ALFWorld 50, WebShop 15,
            Search-QA 4; paper Table C.2).
        history_window (`int`, defaults to `3`):
            Number of recent (observation, action) pairs in a `turn`-layout prompt.
        max_prompt_tokens (`int`, defaults to `2048`):
            A trajectory whose next prompt would be longer ends there, marked truncated (Table C.2: 2,048 for
            ALFWorld, 4,096 for WebShop and Search-QA).
        env_workers (`int`, defaults to `0`):
            Worker processes stepping environments; 0 runs them in the training process. Workers are spawned
            and import the main script, so a script that trains with workers runs its training under
            `if __name__ == "__main__":` (without it, the first worker dies during start-up and the error says so).
        env_step_timeout (`float`, defaults to `300.0`):
            Seconds an environment worker may take to reset or step its episodes of one turn. A worker past it,
            or one that died, is killed and replaced; its episodes end with an environment error. With
            `env_workers=0` each environment call gets this long on a helper thread: a call past it ends its
            episode, but cannot be stopped and keeps its thread, so use workers for environments that can hang.
        max_env_error_rate (`float`, defaults to `0.5`):
            Training stops with an error, after saving a checkpoint, once `env/error_rate` has been above this for
            `env_error_patience` consecutive rollout batches: training on failed episodes is not training. 1.0
            turns the guard off.
        env_error_patience (`int`, defaults to `3`):
            Consecutive rollout batches above `max_env_error_rate` before training stops. An episode counts as
            failed when it ended with an environment error or went on past a failed step (a step whose `info` has
            a `*_error` key, e.g. Search-QA's `retrieval_error`). TASPO holds its analyzer's failed-call rate to
            the same two settings.
        invalid_action_penalty (`float`, defaults to `0.0`):
            Subtracted from a trajectory's reward once per turn whose response had no valid action block.
        turn_balanced_loss (`bool`, defaults to `True`):
            Eq. 7: average the token loss within each turn, then over the trajectory's $T_i$ turns, then over the
            $B$ trajectories. Implemented as token weights $1/(T_i |\mathcal{R}_{it}|)$ on TRL's `"dapo"` loss,
            whose normalizer then equals the number of trajectories; requires `loss_type="dapo"`. A.3 keeps it
            active for every method, so GRPO, TASPO and AlignOPSD share the same normalisation.
        advantage_epsilon (`float`, defaults to `1e-4`):
            $\delta$ in $A_i = (R_i - \mu)/(\sigma + \delta)$ (Sec. 3.1).
        rollout_batch_size (`int` or `None`, defaults to `None`):
            Sequences per `generate` call on the transformers backend; `None` = every live trajectory at once.
        rescore_batch_size (`int` or `None`, defaults to `None`):
            Rows per forward pass in the privileged rescoring passes of TASPO / AlignOPSD; `None` =
            `per_device_train_batch_size`.
        skill_bank (`str`, defaults to `"alfworld"`):
            The SkillBank of every skill-conditioned method (`alfworld`, `webshop`, `searchqa` or a JSONL path):
            `generic_skill` privileged contexts (TASPO's Table 2 ablation, the comparison methods' teachers),
            AlignOPSD's p_x, and Skill-GRPO's prompt skills.
        skill_top_k (`int`, defaults to `2`):
            Skills retrieved per task from `skill_bank` (AlignOPSD: $k$, illegible in the paper).
        prompt_skill_bank (`str` or `None`, defaults to `None`):
            Skill-GRPO (SDAR's baseline): a SkillBank (`alfworld`, `webshop`, `searchqa` or a JSONL path) whose
            top-`prompt_skill_top_k` skills for each task are shown in the policy's own prompt. `None`: no skills.
        prompt_skill_top_k (`int`, defaults to `2`):
            Skills retrieved per task for `prompt_skill_bank`.
        log_turns (`bool`, defaults to `False`):
            Append one JSON line per turn (task, action, observation, advantage) to `<output_dir>/turns.jsonl`
            every step. TRL's `log_completions` shows one row per trajectory with its per-turn advantages.

    TRL's own fields keep TRL's meaning (the vLLM importance-sampling modes and bounds, sampling settings such as
    `min_p`, `repetition_penalty` and `generation_kwargs`, the loss settings). The few the agent loop cannot
    reproduce are refused with the fix in the message: `multi_objective_aggregation="normalize_then_sum"`,
    `scale_rewards="batch"`, `mask_truncated_completions=True`, `pad_to_multiple_of`, `chat_template_kwargs`, and
    transformers continuous batching.
    """

    environment: str = field(default="alfworld", metadata={"help": "Registered environment name."})
    layout: str = field(default="turn", metadata={"help": "Row layout: 'turn' or 'sequence'."})
    max_turns: int | None = field(default=None, metadata={"help": "Turn cap per episode (None: environment's)."})
    history_window: int = field(default=3, metadata={"help": "Recent steps shown in a turn-layout prompt."})
    max_prompt_tokens: int = field(default=2048, metadata={"help": "Longest prompt before a trajectory is cut."})
    env_workers: int = field(default=0, metadata={"help": "Environment worker processes (0: in-process)."})
    env_step_timeout: float = field(default=300.0, metadata={"help": "Seconds per worker reset/step call."})
    max_env_error_rate: float = field(default=0.5, metadata={"help": "Stop when env/error_rate stays above this."})
    env_error_patience: int = field(default=3, metadata={"help": "Rollout batches above max_env_error_rate."})
    invalid_action_penalty: float = field(default=0.0, metadata={"help": "Reward penalty per invalid turn."})
    turn_balanced_loss: bool = field(default=True, metadata={"help": "Eq. 7 turn-balanced loss normalisation."})
    advantage_epsilon: float = field(default=1e-4, metadata={"help": "delta in the GRPO advantage (Sec. 3.1)."})
    rollout_batch_size: int | None = field(default=None, metadata={"help": "Sequences per generate call."})
    rescore_batch_size: int | None = field(default=None, metadata={"help": "Rows per privileged forward."})
    skill_bank: str = field(default="alfworld", metadata={"help": "SkillBank name or JSONL path."})
    skill_top_k: int = field(default=2, metadata={"help": "Skills retrieved per task."})
    prompt_skill_bank: str | None = field(default=None, metadata={"help": "Skill-GRPO: skills in the policy prompt."})
    prompt_skill_top_k: int = field(default=2, metadata={"help": "Skills per task for prompt_skill_bank."})
    log_turns: bool = field(default=False, metadata={"help": "Write per-turn records to <output_dir>/turns.jsonl."})

    def __post_init__(self):
        # TRL's own check divides by num_generations, so a zero would surface as a ZeroDivisionError.
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (GRPO compares each task's rollouts with each other), got "
                f"{self.num_generations}. Set num_generations: 2 or more."
            )
        adopt_activation_checkpointing(self)
        resolve_config_precision(self)  # before TRL's, which makes an unset bf16 True
        try:
            super().__post_init__()
        except ValueError as error:
            raise ValueError(f"{error}{self._batch_fix()}") from None
        self._check_counts()
        check_run_settings(self)
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}.")
        if not self.env_step_timeout > 0:
            raise ValueError(f"env_step_timeout must be > 0 seconds, got {self.env_step_timeout}.")
        if not 0.0 <= self.max_env_error_rate <= 1.0:
            raise ValueError(f"max_env_error_rate must be in [0, 1] (1 turns the guard off), got {self.max_env_error_rate}.")
        if self.env_error_patience < 1:
            raise ValueError(f"env_error_patience must be >= 1, got {self.env_error_patience}.")
        if self.turn_balanced_loss and self.loss_type != "dapo":
            raise ValueError(
                f"turn_balanced_loss=True (Eq. 7) needs loss_type='dapo', got {self.loss_type!r}. "
                "Set loss_type: dapo, or turn_balanced_loss: false to use TRL's own normalisation."
            )
        self._refuse_trl_settings_the_agent_loop_ignores()
        if self.use_vllm:
            _check_vllm_available()

    def _batch_fix(self) -> str:
        """The fix for TRL's 'generation_batch_size must be divisible by num_generations' (else ""): TRL derives
        that batch from fields the user set, so the message names those."""
        batch = self.generation_batch_size
        if batch is None or batch % self.num_generations == 0:
            return ""
        return (
            f" Each generation batch holds whole groups of num_generations={self.num_generations} rollouts; it is "
            "per_device_train_batch_size x gradient_accumulation_steps (or steps_per_generation) x processes "
            "unless generation_batch_size is set: make it a multiple of num_generations, e.g. "
            f"per_device_train_batch_size: {self.num_generations}."
        )

    def _check_counts(self) -> None:
        """The agent settings that are counts or sizes: a bad one fails here, not at the first rollout."""
        minimums = {
            "history_window": 0, "max_prompt_tokens": 1, "env_workers": 0, "skill_top_k": 1, "prompt_skill_top_k": 1,
            "max_turns": 1, "rollout_batch_size": 1, "rescore_batch_size": 1, "max_completion_length": 1,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if value is not None and value < minimum:
                unset = ", or leave it unset" if name in ("max_turns", "rollout_batch_size", "rescore_batch_size") else ""
                raise ValueError(f"{name} must be >= {minimum}, got {value}. Set {name}: {minimum} or more{unset}.")
        if not self.advantage_epsilon > 0:
            raise ValueError(
                f"advantage_epsilon must be > 0 (it keeps A = (R - mean) / (std + epsilon) finite when a group's "
                f"rewards are equal), got {self.advantage_epsilon}. Leave the default 1e-4."
            )

    def _refuse_trl_settings_the_agent_loop_ignores(self) -> None:
        """`AgentGRPOTrainer._generate_and_score_completions` replaces TRL's; a `GRPOConfig` setting it does not
        reproduce is refused here rather than silently ignored (tests/trainers/test_grpo_fidelity.py audits every
        field)."""
        if self.scale_rewards not in ("group", "none"):
            raise ValueError(
                f"scale_rewards must be 'group' or 'none' for agent training, got {self.scale_rewards!r}: outcome "
                "advantages are normalised within each task group (Sec. 3.1). Set scale_rewards: group."
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} is not supported by the agent "
                "trainers: they sum the weighted rewards, then normalise within each group. Set "
                "multi_objective_aggregation: sum_then_normalize."
            )
        if self.mask_truncated_completions:
            raise ValueError(
                "mask_truncated_completions=True is not supported by the agent trainers: a turn cut off at "
                "max_completion_length has already acted on the environment, and its trajectory's reward depends on "
                "it. Set mask_truncated_completions: false (raise max_completion_length if responses are cut off)."
            )
        if self.pad_to_multiple_of is not None:
            raise ValueError(
                f"pad_to_multiple_of={self.pad_to_multiple_of} is not supported by the agent trainers: their "
                "micro-batches are repacked and stripped of padding. Leave pad_to_multiple_of unset."
            )
        if self.chat_template_kwargs:
            raise ValueError(
                "chat_template_kwargs is not passed to the agent loop's chat template, whose prompts must match the "
                "SFT warm start's and taspo-eval's. Leave chat_template_kwargs unset (or give the tokenizer a chat "
                "template with those settings built in)."
            )
        if self.use_transformers_continuous_batching and not self.use_vllm:
            raise ValueError(
                "use_transformers_continuous_batching (or use_transformers_paged) is not supported by the agent "
                "loop, which generates with transformers' generate to record each sampled token's log-prob. Set "
                "use_transformers_continuous_batching: false, or use_vllm: true for TRL's vLLM generation."
            )


def start_turns_log(output_dir: str, resumed: bool) -> str:
    """The path of this run's `turns.jsonl`. A fresh run moves an earlier run's file aside to the first free
    `turns.N.jsonl`, so each file holds one run and none is lost; a resumed run appends to it."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "turns.jsonl")
    if not resumed and os.path.exists(path):
        n = 1
        while os.path.exists(os.path.join(output_dir, f"turns.{n}.jsonl")):
            n += 1
        os.rename(path, os.path.join(output_dir, f"turns.{n}.jsonl"))
    return path


def _check_vllm_available() -> None:
    import importlib.util

    if not torch.cuda.is_available():
        raise ValueError(
            "use_vllm=True needs a CUDA GPU; this machine has none. Set use_vllm: false to generate with "
            "transformers (the default backend, which runs on CPU)."
        )
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("use_vllm=True needs the vllm package: pip install 'taspo-trl[vllm]'.")


def environment_reward(completions: list, env_reward: list[float], **kwargs: Any) -> list[float]:
    """The environment's verified terminal reward (default reward function of the agent trainers)."""
    return [float(r) for r in env_reward]


class AgentGRPOTrainer(AgentModelCard, CheckpointSaving, ScoringPasses, MicroBatchRepacking, GRPOTrainer):
    """`trl.GRPOTrainer` for multi-turn agents; called exactly like it, plus an optional `env_factory`.

    Dataset rows name their task in the `prompt` column as a JSON object (`encode_task_prompt`, or an
    environment's `task_spec_rows`), so the same dataset also works with TRL's `rollout_func` path.
    TRL's `environment_factory=` is taken with TRL's meaning and played by the agent loop
    (`taspo_trl.envs.trl_style`). `reward_funcs` are added to the environment's verified reward
    (`environment_reward`, last in `reward_weights`) and receive, besides TRL's arguments and the row's columns,
    `env_reward`, `won`, `task_type` and `num_turns` per trajectory. A `model` given as a string may also be one of
    this package's names (`embedded`, a warm start's, a LoRA run's output folder; `warmstart.resolve_policy_path`).
    """

    _tag_names = ["trl", "grpo", "taspo-trl", "agent"]
    _name = "Agent GRPO"

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: AgentGRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        env_factory: EnvFactory | None = None,
        prompt_template: PromptTemplate | None = None,
        **kwargs: Any,
    ):
        if args is None:
            raise ValueError("Pass args=AgentGRPOConfig(...) (or TASPOConfig / AlignOPSDConfig).")
        if not isinstance(args, AgentGRPOConfig):
            raise TypeError(f"args must be an AgentGRPOConfig (or a subclass), got {type(args).__name__}.")
        # TRL's environment_factory runs through our agent loop, wrapped into our protocol, never TRL's tool loop.
        environment_factory = kwargs.pop("environment_factory", None)
        refuse_ignored_trainer_arguments(kwargs, args, train_dataset, environment_factory, env_factory)
        if train_dataset is not None and hasattr(train_dataset, "__len__"):  # before the model loads
            check_generation_batch(args, len(train_dataset))
        for note in run_length_notes(args):
            logger.warning(note)
        if isinstance(model, str):  # "embedded", a warm start's name, a LoRA run's output folder, a hub id or a path
            model = resolve_policy_path(model, bf16=args.bf16)
        trl_env = TRLStyleEnvFactory(environment_factory) if environment_factory is not None else None
        if trl_env is not None:
            train_dataset, eval_dataset = keep_prompt_column(train_dataset), keep_prompt_column(eval_dataset)
            reward_funcs = _with_environment_reward(reward_funcs, trl_env)
        else:
            if env_factory is None:
                check_task_rows(args.environment, train_dataset)
            reward_funcs = _with_verified_reward(reward_funcs)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        if trl_env is not None:
            trl_env.action_tag = tool_call_tag(self.processing_class)
        tools = trl_env.tool_schemas if trl_env is not None and trl_env.action_tag == TOOL_CALL_TAG else None
        self.chat = ChatFormat(self.processing_class, tools=tools)
        self.prompt_template = prompt_template or PromptTemplate(history_window=args.history_window)
        self.env_factory = trl_env or env_factory or get_env_factory(args.environment)
        # Its registered name, for what is known by name (the rule-based analyzer's rules); None for a factory.
        if trl_env is not None:
            self.environment_name = trl_env.environment_name
        elif env_factory is None or env_factory is _registered_factory(args.environment):
            self.environment_name = args.environment
        else:
            self.environment_name = None
        self.env_pool = EnvPool(self.env_factory, num_workers=args.env_workers, step_timeout=args.env_step_timeout)
        self._turns_path: str | None = None  # chosen at the first `log_turns` write (see `start_turns_log`)
        self._env_error_streak = 0
        self._replaced_characters = 0  # invalid Unicode characters replaced up to the last logged batch
        self._nan_reward_warned = False
        self.last_step = LastStep()  # the latest step's record, for inspection (notebooks, tests)
        self.prompt_skills = SkillBank.load(args.prompt_skill_bank) if args.prompt_skill_bank else None

    @property
    def metrics_mode(self) -> str:
        """"train" or "eval", as the model is: the key of TRL's ``_metrics`` that this step logs to."""
        return "train" if self.model.training else "eval"

    def _get_train_sampler(self, dataset: Any = None) -> EpochReplaySampler:
        # TRL's sampler, with the per-epoch shuffle that resume_from_checkpoint needs (see sampling.py)
        return EpochReplaySampler(super()._get_train_sampler(dataset))

    # ---- the credit hook -------------------------------------------------------------------------------

    def turn_weights(self, step: StepView) -> TurnCredit:
        """Per-turn advantage weights w_it of each of ``step.trajectories`` (GRPO: 1 for every turn). Subclasses
        implement their method here.

        ``step`` is this process's share of the step (``StepView``): trajectories, outcome advantages, training
        rows and their tensors (incl. ``sampling_per_token_logps`` and, when TRL computed them,
        ``old_per_token_logps``). An entry may be a list with one weight per response token (token-level
        allocation ablations); plain nested lists are accepted too.
        """
        return TurnCredit.uniform(t.num_turns for t in step.trajectories)

    def turn_advantages(self, step: StepView) -> TurnCredit:
        """Per-turn advantages (a float, or one per response token). Default: ``A_i * w_it`` from
        :meth:`turn_weights`. Methods whose credit is additive (OPID, GiGPO, distillation terms) override this."""
        weights = TurnCredit.of(self.turn_weights(step))
        self._log_weight_range(weights, step.mode)
        return weights.scaled(step.advantages.tolist())

    # ---- one step ----------------------------------------------------------------------------------------

    def _any_process_live(self, local_live: bool) -> bool:
        flag = torch.tensor([1.0 if local_live else 0.0], device=self.accelerator.device)
        return bool(self.accelerator.gather(flag).sum().item() > 0)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        device = self.accelerator.device
        mode = self.metrics_mode
        args = self.args
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval

        # 1. Rollouts: one episode per row; the K siblings of a task are consecutive rows.
        started = time.perf_counter()
        specs = [task_spec_from_row(row) for row in inputs]
        if self.prompt_skills is not None:
            add_skill_guidance(specs, self.prompt_skills, args.prompt_skill_top_k)
        multi_process = self.accelerator.num_processes > 1
        trajectories = run_agent_loop(
            specs,
            self.env_pool,
            generator_for_trainer(self, batch_size=args.rollout_batch_size),
            self.chat,
            layout=args.layout,
            template=self.prompt_template,
            max_turns=args.max_turns,
            max_prompt_tokens=args.max_prompt_tokens,
            group_size=num_generations,
            invalid_action_penalty=args.invalid_action_penalty,
            any_process_live=self._any_process_live if (multi_process and self.use_vllm) else None,
        )
        rollout_seconds = time.perf_counter() - started
        first = self.accelerator.process_index * len(inputs)
        for k, trajectory in enumerate(trajectories):  # group ids over the whole batch, not this process's share
            trajectory.group = (first + k) // num_generations
        everything = gather_object(trajectories) if multi_process else list(trajectories)  # the step's one gather
        self.last_step = LastStep(trajectories=trajectories)

        # 2. Rewards through TRL's reward functions.
        rewards_per_func, rewards = self._trajectory_rewards(inputs, trajectories)

        # 3. Outcome advantages over all processes' rewards, then this process's slice.
        all_advantages = grpo_outcome_advantages(
            rewards, num_generations, delta=args.advantage_epsilon, scale=self.scale_rewards != "none"
        )
        advantages = all_advantages[first : first + len(inputs)].cpu()

        # 4. Rows in the configured layout, with the tensors TRL's loss needs (log-probs of the snapshot/reference).
        rows = build_rows(
            trajectories,
            args.layout,
            pad_to_multiple=args.steps_per_generation if mode == "train" else 1,
            min_rows=self._max_over_processes(sum(t.num_turns for t in trajectories)) if args.layout == "turn" else 0,
            pad_token_id=self._tokenizer.pad_token_id,
        )
        batch = self._batch_from_rows(rows, mode)

        # 5. Method credit: every policy token of turn t gets its advantage (A_i * w_it for the redistribution
        #    methods) and the Eq. 7 balancing weight 1 / (T_i |R_it|) (a fractional token mask on TRL's "dapo" loss).
        step = StepView(trajectories, advantages, rows, batch, rewards, first=first,
                        batch_advantages=all_advantages.cpu(), everything=everything, mode=mode)
        per_turn_advantage = TurnCredit.of(self.turn_advantages(step))
        if [len(turns) for turns in per_turn_advantage] != [t.num_turns for t in trajectories]:
            raise ValueError(f"{type(self).__name__}.turn_advantages must give each trajectory one value per turn "
                             f"({[t.num_turns for t in trajectories]} turns), got {[len(a) for a in per_turn_advantage]}.")
        if args.turn_balanced_loss:
            balance = rows.spread([turn_balanced_token_weights(_turn_lengths(t)) for t in trajectories])
        else:
            balance = [[float(m) for m in mask] for mask in rows.env_mask]
        batch["advantages"] = _pad_right(rows.spread(per_turn_advantage), 0.0, device, torch.float32)
        batch["tool_mask"] = _pad_right(balance, 0.0, device, torch.float32)
        batch["num_items_in_batch"] = self.accelerator.gather((batch["completion_mask"] * batch["tool_mask"]).sum()).sum()

        self._log_agent_metrics(everything, rows, rollout_seconds, mode)
        self._metrics[mode]["reward"].append(torch.nanmean(rewards).item())
        self._metrics[mode]["reward_std"].append(_nanstd(rewards))
        for k, name in enumerate(self.reward_func_names):
            self._metrics[mode][f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, k]).item())
        self._log_turn_table(everything, per_turn_advantage, rewards_per_func, all_advantages)
        return batch

    def _log_turn_table(
        self,
        everything: list[Trajectory],
        per_turn_advantage: TurnCredit,
        rewards_per_func: torch.Tensor,
        all_advantages: torch.Tensor,
    ) -> None:
        """TRL's completions table (`log_completions`, shown in the console and sent to wandb/trackio) with one
        row per trajectory of the step (``everything``, all processes'): the task, the transcript, the outcome
        advantage and each turn's mean advantage; and, with `log_turns`, one JSON line per turn in
        `<output_dir>/turns.jsonl` for inspection. ``per_turn_advantage`` is this process's share."""
        local_means = per_turn_advantage.turn_means()
        # One collective: every process's turn means, in process order as ``everything``.
        turn_means = gather_object(local_means) if self.accelerator.num_processes > 1 else local_means
        for trajectory, means in zip(everything, turn_means, strict=True):
            self._logs["prompt"].append(trajectory.task)
            self._logs["completion"].append(
                " | ".join(f"{t + 1}. {turn.action or '(invalid)'}" for t, turn in enumerate(trajectory.turns)))
            self._logs["extra"]["turn_advantages"].append(", ".join(f"{a:+.3f}" for a in means))
        for k, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, k].tolist())
        self._logs["advantages"].extend(all_advantages.tolist())
        if not self.args.log_turns or not self.accelerator.is_main_process:
            return
        if self._turns_path is None:
            self._turns_path = start_turns_log(self.args.output_dir, resumed=self.state.global_step > 0)
        with open(self._turns_path, "a") as handle:
            handle.writelines(
                json.dumps({
                    "step": self.state.global_step, "group": trajectory.group, "task": trajectory.task,
                    "task_type": trajectory.task_type, "won": trajectory.won, "turn": t, "action": turn.action,
                    "valid": turn.action_valid, "observation": turn.observation[:300], "advantage": means[t],
                }) + "\n"
                for trajectory, means in zip(everything, turn_means, strict=True)
                for t, turn in enumerate(trajectory.turns)
            )

    def _trajectory_rewards(
        self, inputs: list[dict[str, Any]], trajectories: list[Trajectory]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each reward function's score of every trajectory, and their weighted sum (NaN where all are NaN). The
        reward functions see the trajectory's fields as keyword arguments."""
        for row, trajectory in zip(inputs, trajectories, strict=True):
            row.update(
                env_reward=trajectory.reward,
                won=trajectory.won,
                task_type=trajectory.task_type,
                num_turns=trajectory.num_turns,
            )
        prompts = [row["prompt"] for row in inputs]
        completions = [t.turns[-1].response_text if t.turns else "" for t in trajectories]
        completion_ids = [t.turns[-1].response_ids if t.turns else [] for t in trajectories]
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids)
        rewards = (rewards_per_func * self.reward_weights.to(self.accelerator.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        unscored = int(torch.isnan(rewards).sum())
        if unscored and not self._nan_reward_warned:  # one line per run; TRL's own warning shows one row's kwargs
            self._nan_reward_warned = True
            logger.warning(
                "%d of %d trajectories have no reward (every reward function gave None or NaN): as in TRL they get "
                "advantage 0, stay out of their group's mean and std, and the logged reward averages the others "
                "(no value when none is left). Said once per run.", unscored, len(rewards),
            )
        return rewards_per_func, rewards

    def _batch_from_rows(self, rows: Rows, mode: str) -> dict[str, Any]:
        """Padded tensors of the rows and the log-probs TRL's loss needs; advantages and masks come after credit."""
        device = self.accelerator.device

        prompt_ids = pad(
            [torch.tensor(p) for p in rows.prompt_ids], padding_value=self._tokenizer.pad_token_id, padding_side="left"
        ).to(device)
        prompt_mask = pad(
            [torch.ones(len(p), dtype=torch.long) for p in rows.prompt_ids], padding_value=0, padding_side="left"
        ).to(device)
        completion_ids = _pad_right(rows.completion_ids, self._tokenizer.pad_token_id, device)
        completion_mask = _pad_right([[1] * len(c) for c in rows.completion_ids], 0, device)
        env_mask = _pad_right(rows.env_mask, 0, device, torch.float32)
        sampling_logps = _pad_right(rows.logprobs, 0.0, device, torch.float32)
        batch: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "sampling_per_token_logps": sampling_logps,
        }
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        generate_every = self.args.steps_per_generation * self.num_iterations
        with torch.no_grad():
            needs_old = self.args.gradient_accumulation_steps % generate_every != 0 or (
                self.use_vllm and self.vllm_importance_sampling_correction
            )
            if needs_old:
                batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
                )
            if self.use_vllm and self.vllm_importance_sampling_correction:
                batch["importance_sampling_ratio"] = vllm_importance_sampling_ratio(
                    batch["old_per_token_logps"],
                    sampling_logps,
                    completion_mask * env_mask,
                    self.vllm_importance_sampling_mode,
                    self.vllm_importance_sampling_clip_min,
                    self.vllm_importance_sampling_clip_max,
                )
            if self.beta != 0.0:
                batch["ref_per_token_logps"] = self._reference_logps(input_ids, attention_mask, logits_to_keep, batch_size)
        return batch

    def _reference_logps(self, input_ids, attention_mask, logits_to_keep, batch_size) -> torch.Tensor:
        if self.ref_model is not None:
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )
            return logps
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )
        return logps

    def _log_weight_range(self, weights: TurnCredit, mode: str) -> None:
        flat = weights.flat()
        if flat:
            self._metrics[mode]["credit/weight_min"].append(min(flat))
            self._metrics[mode]["credit/weight_max"].append(max(flat))

    def _log_agent_metrics(self, everything: list[Trajectory], rows: Rows, rollout_seconds: float, mode: str) -> None:
        """The batch's success, turn and fault rates over every process's trajectories (``everything``)."""
        episodes = [(t.task_type or "all", t.won, t.num_turns, t.truncated, t.had_fault) for t in everything]
        total_invalid = sum(not turn.action_valid for t in everything for turn in t.turns)
        total_turns = sum(t.num_turns for t in everything)
        metrics = self._metrics[mode]
        by_family: dict[str, list[bool]] = defaultdict(list)
        for family, won, *_ in episodes:
            by_family[family].append(won)
        for family, wins in sorted(by_family.items()):
            metrics[f"success/{family}"].append(sum(wins) / len(wins))
        metrics["success/all"].append(sum(w for _, w, *_ in episodes) / max(len(episodes), 1))
        metrics["env/turns_mean"].append(sum(n for _, _, n, _, _ in episodes) / max(len(episodes), 1))
        metrics["env/truncated_rate"].append(sum(tr for *_, tr, _ in episodes) / max(len(episodes), 1))
        # An episode that failed at the end (error) or went on past a failed step (faults, e.g. a retrieval error)
        error_rate = sum(e for *_, e in episodes) / max(len(episodes), 1)
        metrics["env/error_rate"].append(error_rate)
        if mode == "train":
            self._guard_env_error_rate(error_rate)
        metrics["env/invalid_action_rate"].append(total_invalid / max(total_turns, 1))
        metrics["env/rollout_seconds"].append(rollout_seconds)
        metrics["rows/count"].append(float(len(rows)))
        replaced = self.env_pool.replaced_characters + self.chat.replaced_characters
        metrics["env/replaced_characters"].append(float(replaced - self._replaced_characters))
        self._replaced_characters = replaced

    def _guard_env_error_rate(self, error_rate: float) -> None:
        """Stops a run whose episodes keep failing, after a checkpoint. The rate is gathered over all processes,
        so every process decides alike and joins the (collective) save."""
        self._env_error_streak = self._env_error_streak + 1 if error_rate > self.args.max_env_error_rate else 0
        if self._env_error_streak < self.args.env_error_patience:
            return
        self._save_checkpoint(self.model, trial=None)
        raise RuntimeError(
            f"env/error_rate was above max_env_error_rate={self.args.max_env_error_rate} for "
            f"{self._env_error_streak} consecutive rollout batches (last: {error_rate:.2f}); training stopped after "
            f"saving checkpoint-{self.state.global_step} in {self.args.output_dir}. The environment errors are in the "
            "log; fix the environment (or raise max_env_error_rate) and resume with --resume_from_checkpoint."
        )

    def close(self) -> None:
        self.env_pool.shutdown()


def _registered_factory(name: str) -> EnvFactory | None:
    """The factory registered as environment ``name``, or None."""
    try:
        return get_env_factory(name)
    except ValueError:
        return None


def _with_verified_reward(reward_funcs: Any) -> list[Any]:
    """The reward sources of an agent environment (built in, or an ``env_factory``): the reward functions given,
    then ``environment_reward`` (the environment's verified reward), as TRL adds an ``environment_factory``'s
    reward to the reward functions; its weight in ``reward_weights`` comes last (0 drops it)."""
    given = reward_func_list(reward_funcs)
    if environment_reward in given:
        return checked_reward_funcs(given)
    if given:
        names = ", ".join(getattr(f, "__name__", type(f).__name__) for f in given)
        logger.info("reward: %s plus environment_reward (the environment's verified reward, last in reward_weights)",
                    names)
    return checked_reward_funcs(given) + [environment_reward]


def _with_environment_reward(reward_funcs: Any, trl_env: TRLStyleEnvFactory) -> Any:
    """TRL's reward sources for an ``environment_factory``: the reward functions plus, when the environment has
    ``get_reward``, its reward (weight 1, named after the class); without ``get_reward``, reward functions are
    required."""
    if not trl_env.has_reward:
        if reward_funcs is None:
            raise ValueError(
                f"No reward source: {trl_env.name} has no get_reward() and no reward_funcs were passed. Define "
                "get_reward(self) -> float on the environment, or pass reward_funcs=[...]."
            )
        return checked_reward_funcs(reward_funcs)
    given = reward_func_list(reward_funcs)
    return checked_reward_funcs(given) + [trl_env.reward_function()]


def _pad_right(values: list[list[float]] | list[list[int]], fill: float, device: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    return pad([torch.tensor(v, dtype=dtype) for v in values], padding_value=fill, padding_side="right").to(device)


def _turn_lengths(trajectory: Trajectory) -> list[int]:
    return [len(turn.response_ids) for turn in trajectory.turns]


def _nanstd(values: torch.Tensor) -> float:
    finite = values[~torch.isnan(values)]
    return finite.std().item() if finite.numel() > 1 else 0.0
