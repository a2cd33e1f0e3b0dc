"""Where `AgentGRPOTrainer` replaces TRL's `_generate_and_score_completions`, TRL's settings keep their meaning:
the vLLM importance-sampling correction against TRL's own computation on the same tensors, and every
`GRPOConfig` field either honoured, refused with the fix in the message, or listed as irrelevant with a reason."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from cpu_config import cpu_trainer_kwargs
from datasets import Dataset
from toy_envs import locker_factory
from transformers import TrainingArguments
from trl import GRPOConfig, GRPOTrainer

from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt
from taspo_trl.rollout.layouts import build_rows
from taspo_trl.trainers.grpo import VLLM_IMPORTANCE_SAMPLING_MODES, vllm_importance_sampling_ratio

# ----------------------------------------------------------------------------------------------- importance sampling

# Sampling log-probs of 4 completions as a sampler would report them; None is a token vLLM could not score.
# They sit around -log(vocabulary) (the tiny random model's log-probs), so ratios land on both sides of the bounds.
SAMPLED = [
    [-10.2, -11.5, -10.9, None, -11.8, -10.0],
    [-11.0, -10.4, -11.9],
    [-9.6, -10.1, -9.9, -10.3, -9.8],
    [-11.6, -12.0, -11.4, -11.9],
]
# Environment tokens (0) inside the completions, as an agent rollout has them.
ENV_MASK = [[1, 1, 0, 1, 1, 1], [1, 1, 1], [1, 1, 1, 0, 1], [1, 1, 1, 1]]


def _trl_outputs(tiny_model_dir: str, tmp_path, mode: str, clip_min: float | None, clip_max: float | None) -> dict:
    """TRL's own `_generate_and_score_completions` on the completions above, delivered through TRL's
    `rollout_func`, with the vLLM correction switched on (vLLM itself needs a GPU; the correction only needs the
    sampler's log-probs, which `rollout_func` supplies)."""

    def rollout(prompts, trainer):
        return {
            "prompt_ids": [[1, 2, 3]] * len(prompts),
            "completion_ids": [[7 + k for k in range(len(row))] for row in SAMPLED],
            "logprobs": SAMPLED,
            "env_mask": ENV_MASK,
        }

    args = GRPOConfig(**cpu_trainer_kwargs(tmp_path / "trl", num_generations=2, max_completion_length=8))
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "q"}] * 4),
        rollout_func=rollout,
    )
    trainer.use_vllm = True
    trainer._last_loaded_step = trainer.state.global_step  # no vLLM engine to sync weights into
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_min = clip_min
    trainer.vllm_importance_sampling_clip_max = clip_max
    return trainer._generate_and_score_completions([{"prompt": "q"}] * 4)


@pytest.mark.parametrize("clip_min,clip_max", [(None, 3.0), (0.5, 2.0)])
@pytest.mark.parametrize("mode", VLLM_IMPORTANCE_SAMPLING_MODES)
def test_importance_sampling_ratio_is_trls(tiny_model_dir, tmp_path, mode, clip_min, clip_max):
    trl = _trl_outputs(tiny_model_dir, tmp_path, mode, clip_min, clip_max)
    mask = trl["completion_mask"] * trl["tool_mask"]
    ours = vllm_importance_sampling_ratio(
        trl["old_per_token_logps"], trl["sampling_per_token_logps"], mask, mode, clip_min, clip_max
    )
    assert ours.shape == trl["importance_sampling_ratio"].shape == ((4, 1) if mode.startswith("sequence") else (4, 6))
    assert torch.equal(ours, trl["importance_sampling_ratio"])
    # The tensors exercise the bounds: some raw ratio falls outside them (so truncation or masking acted).
    unbounded = mode.replace("truncate", "mask")
    raw = vllm_importance_sampling_ratio(trl["old_per_token_logps"], trl["sampling_per_token_logps"], mask, unbounded)
    raw = raw[mask.bool()] if mode.startswith("token") else raw
    low = clip_min if clip_min is not None else -math.inf
    assert ((raw < low) | (raw > clip_max)).any()


def test_unknown_importance_sampling_mode_is_refused():
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        vllm_importance_sampling_ratio(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "sequence")


def test_trainer_rows_get_one_sequence_ratio_over_their_policy_tokens(tmp_path, tiny_model_dir):
    """TRL 1.16's default (`sequence_mask`) in the trainer's own rows: with the sampler's log-probs d_r above
    the recomputed ones on every policy token of row r, the row's ratio is exp(-d_r n_r) over its n_r policy
    tokens (the observation tokens of a `sequence` row do not count), or 0 below `clip_min`."""
    config = AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path / "out", layout="sequence", max_completion_length=12))
    rows_in = [{"prompt": encode_task_prompt({"target": 2, "max_turns": 3})}] * 4
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=Dataset.from_list(rows_in),
                               env_factory=locker_factory)
    offsets = [0.01, 0.03, 0.05, 0.07]
    try:
        trainer._generate_and_score_completions([dict(r) for r in rows_in])
        rows = build_rows(trainer._last_trajectories, "sequence", pad_token_id=trainer._tokenizer.pad_token_id)
        rows.logprobs = [
            [lp + d * m for lp, m in zip(lps, mask)] for lps, mask, d in zip(rows.logprobs, rows.env_mask, offsets)
        ]
        unbounded = [math.exp(-d * sum(mask)) for mask, d in zip(rows.env_mask, offsets)]
        low, high = sorted(unbounded)[1:3]
        clip_min = math.sqrt(low * high)  # two rows on each side, far from the bound
        trainer.use_vllm = True
        trainer.vllm_importance_sampling_clip_min = clip_min
        assert trainer.vllm_importance_sampling_mode == "sequence_mask"  # TRL's default
        batch = trainer._batch_from_rows(rows, "train")
    finally:
        trainer.close()
    expected = [[r if r >= clip_min else 0.0] for r in unbounded]
    assert batch["importance_sampling_ratio"].shape == (len(rows), 1)
    assert torch.allclose(batch["importance_sampling_ratio"], torch.tensor(expected), atol=2e-3)
