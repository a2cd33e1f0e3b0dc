"""The agent loop as a plain TRL ``rollout_func``, for users who keep ``trl.GRPOTrainer`` itself.

    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=rows,
                          reward_funcs=[environment_reward], rollout_func=make_rollout_func(alfworld_env_factory))

TRL expects one row per prompt, so this path uses the ``sequence`` layout: each trajectory is one row whose
observation tokens are masked by ``env_mask``. The trajectory's fields (``env_reward``, ``won``, ``task_type``,
``num_turns``) reach the reward functions as keyword arguments.
"""

from __future__ import annotations

from typing import Any, Callable

from ..envs.base import EnvFactory, PromptTemplate, task_spec_from_row
from .chat import ChatFormat
from .env_pool import EnvPool
from .generation import generator_for_trainer
from .layouts import build_rows
from .loop import run_agent_loop


def make_rollout_func(
    env_factory: EnvFactory,
    *,
    max_turns: int | None = None,
    max_prompt_tokens: int | None = None,
    env_workers: int = 0,
    env_step_timeout: float = 300.0,
    template: PromptTemplate | None = None,
) -> Callable[[list[Any], Any], dict[str, list]]:
    """Builds ``rollout_func(prompts, trainer)`` running the batched multi-turn loop on ``env_factory``.

    With ``env_workers > 0`` the environments step in worker processes, and a worker that takes longer than
    ``env_step_timeout`` seconds for a reset or a step is replaced: its episodes end with an environment error
    (``AgentGRPOConfig.env_step_timeout``'s meaning). In process there is no hard timeout.
    """
    pool = EnvPool(env_factory, num_workers=env_workers, step_timeout=env_step_timeout)
    chats: dict[int, ChatFormat] = {}

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        chat = chats.setdefault(id(trainer), ChatFormat(trainer.processing_class))
        trajectories = run_agent_loop(
            [task_spec_from_row({"prompt": p}) for p in prompts],
            pool,
            generator_for_trainer(trainer),
            chat,
            layout="sequence",
            template=template,
            max_turns=max_turns,
            max_prompt_tokens=max_prompt_tokens,
            group_size=trainer.num_generations,
        )
        rows = build_rows(trajectories, "sequence", pad_token_id=trainer.processing_class.pad_token_id)
        return {
            "prompt_ids": rows.prompt_ids,
            "completion_ids": rows.completion_ids,
            "logprobs": rows.logprobs,
            "env_mask": rows.env_mask,
            "env_reward": [t.reward for t in trajectories],
            "won": [t.won for t in trajectories],
            "task_type": [t.task_type for t in trajectories],
            "num_turns": [t.num_turns for t in trajectories],
        }

    return rollout_func
