"""Where `AgentGRPOTrainer` replaces TRL's `_generate_and_score_completions`, TRL's settings keep their meaning:
the vLLM importance-sampling correction against TRL's own computation on the same tensors, and every
`GRPOConfig` field either honoured, refused with the fix in the message, or listed as irrelevant with a reason."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from datasets import Dataset
from transformers import TrainingArguments
from trl import GRPOConfig, GRPOTrainer

from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt
from taspo_trl.rollout.layouts import build_rows
from taspo_trl.trainers.scoring import VLLM_IMPORTANCE_SAMPLING_MODES, vllm_importance_sampling_ratio
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.toy_envs import locker_factory

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
        rows = build_rows(trainer.last_step.trajectories, "sequence", pad_token_id=trainer._tokenizer.pad_token_id)
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


# ----------------------------------------------------------------------------------------------- the GRPOConfig audit

_LOSS = "TRL's `_compute_loss`, which the agent trainers do not override"
_VLLM = "TRL's `VLLMGeneration`, which the agent loop calls through `_generate_single_turn`"
_INIT = "TRL's `GRPOTrainer.__init__`, which the agent trainers call unchanged"
_LOG = "TRL's `log`, fed one row per trajectory by `_log_turn_table`"
_GENERATE = "`generator_for_trainer`: transformers `generate` arguments, or TRL's vLLM engine"

HONOURED = {
    # read by TRL's `_generate_and_score_completions` among the TrainingArguments fields
    "per_device_train_batch_size": "forward batch of the log-prob passes in `_batch_from_rows`",
    "per_device_eval_batch_size": "forward batch of the log-prob passes in evaluation",
    "gradient_accumulation_steps": "whether the rollout snapshot's log-probs are needed (`_batch_from_rows`)",
    "gradient_checkpointing_kwargs": "generation's `unwrap_model_for_generation`; training through TRL",
    # GRPOConfig's own fields
    "model_init_kwargs": _INIT, "trust_remote_code": _INIT, "disable_dropout": _INIT,
    "router_aux_loss_coef": _LOSS + "; log-probs take TRL's path when the router loss is on",
    "cast_lm_head_to_fp32": _INIT + "; log-probs take TRL's path when it is set",
    "num_generations": "the siblings of a task group in the agent loop and the group-relative advantages",
    "num_generations_eval": "the same in evaluation",
    "max_completion_length": "the response limit of every turn",
    "ds3_gather_for_generation": "`unwrap_model_for_generation` in `generator_for_trainer`",
    "shuffle_dataset": "TRL's sampler", "generation_batch_size": "TRL's sampler and `_prepare_inputs`",
    "steps_per_generation": "TRL's sampler and `_prepare_inputs`",
    "temperature": _GENERATE + "; the log-prob passes", "top_p": _GENERATE, "top_k": _GENERATE, "min_p": _GENERATE,
    "repetition_penalty": _GENERATE, "cache_implementation": _GENERATE, "generation_kwargs": _GENERATE,
    "use_vllm": "TRL's vLLM generation (`TRLGenerator`)",
    "vllm_mode": _VLLM, "vllm_model_impl": _VLLM, "vllm_enable_sleep_mode": _VLLM,
    "vllm_structured_outputs_regex": _VLLM, "vllm_server_base_url": _VLLM, "vllm_server_host": _VLLM,
    "vllm_server_port": _VLLM, "vllm_server_timeout": _VLLM, "vllm_group_port": _VLLM,
    "vllm_gpu_memory_utilization": _VLLM, "vllm_max_model_length": _VLLM, "vllm_tensor_parallel_size": _VLLM,
    "beta": "reference log-probs in `_batch_from_rows`; " + _LOSS,
    "num_iterations": "TRL's `_prepare_inputs`; the snapshot's log-probs when generation and updates misalign",
    "epsilon": _LOSS, "delta": _LOSS, "epsilon_high": _LOSS, "sapo_temperature_neg": _LOSS,
    "sapo_temperature_pos": _LOSS, "vespo_k_pos": _LOSS, "vespo_lambda_pos": _LOSS, "vespo_k_neg": _LOSS,
    "vespo_lambda_neg": _LOSS, "importance_sampling_level": _LOSS, "use_bias_correction_kl": _LOSS,
    "off_policy_mask_threshold": _LOSS + ", with the sampling log-probs every row carries",
    "top_entropy_quantile": _LOSS, "entropy_coef": _LOSS, "use_adaptive_entropy": _LOSS, "entropy_coef_min": _LOSS,
    "entropy_coef_max": _LOSS, "entropy_coef_delta": _LOSS, "entropy_target": _LOSS,
    "loss_type": _LOSS + " (Eq. 7's turn balancing needs dapo)",
    "reward_weights": "the weighted sum of TRL's reward functions",
    "multi_objective_aggregation": "sum_then_normalize, the default",
    "scale_rewards": "group and none",
    "sync_ref_model": _INIT + " (its callback)", "ref_model_mixup_alpha": _INIT + " (its callback)",
    "ref_model_sync_steps": _INIT + " (its callback)",
    "vllm_importance_sampling_correction": "`vllm_importance_sampling_ratio`, checked against TRL above",
    "vllm_importance_sampling_mode": "`vllm_importance_sampling_ratio`, checked against TRL above",
    "vllm_importance_sampling_clip_max": "`vllm_importance_sampling_ratio`, checked against TRL above",
    "vllm_importance_sampling_clip_min": "`vllm_importance_sampling_ratio`, checked against TRL above",
    "vllm_importance_sampling_cap": "deprecated; TRL's GRPOConfig copies it into vllm_importance_sampling_clip_max",
    "log_completions": _LOG, "num_completions_to_print": _LOG, "log_unique_prompts": _LOG,
    "log_completions_hub_repo": _LOG,
}
# A value of the field the agent trainers cannot reproduce, which their config must refuse.
REJECTED = {
    "multi_objective_aggregation": "normalize_then_sum",
    "scale_rewards": "batch",
    "mask_truncated_completions": True,
    "pad_to_multiple_of": 8,
    "chat_template_kwargs": {"enable_thinking": False},
    "use_transformers_continuous_batching": True,
    "use_transformers_paged": True,
}
IRRELEVANT = {
    "max_tool_calling_iterations": "TRL's tool-calling loop: environments act through the agent loop, not TRL tools",
    "log_multimodal": "agent rollouts carry no images",
    "transformers_continuous_batching_config": "read only by continuous batching, which is refused",
}


def test_every_grpo_config_field_is_honoured_rejected_or_irrelevant():
    """A field TRL adds in a later version fails here until someone decides what the agent trainers do with it.
    TrainingArguments fields that TRL's `_generate_and_score_completions` does not read stay with transformers'
    Trainer loop, which the agent trainers do not override."""
    trainer_loop = {f.name for f in dataclasses.fields(TrainingArguments)} - set(HONOURED)
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    accounted = set(HONOURED) | set(REJECTED) | set(IRRELEVANT)
    assert sorted(grpo_fields - accounted - trainer_loop) == []
    assert sorted(accounted - grpo_fields) == []  # no entry outlives its field
    assert not set(IRRELEVANT) & (set(HONOURED) | set(REJECTED))
    assert all(reason for reason in {**HONOURED, **IRRELEVANT}.values())


@pytest.mark.parametrize(("name", "value"), REJECTED.items(), ids=list(REJECTED))
def test_settings_the_agent_loop_cannot_honour_are_refused_with_the_fix(tmp_path, name, value):
    with pytest.raises(ValueError, match=name.removesuffix("_paged")) as refused:
        AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path, **{name: value}))
    assert "Set " in str(refused.value) or "Leave " in str(refused.value)


def test_continuous_batching_is_left_to_trl_under_vllm(tmp_path):
    """With use_vllm TRL itself generates with vLLM and never reaches continuous batching, so it is not refused
    on that account (here vLLM is refused instead: this machine has no GPU)."""
    with pytest.raises(ValueError, match="CUDA"):
        AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path, use_vllm=True, use_transformers_continuous_batching=True))


def _first_responses(trainer: AgentGRPOTrainer, rows: list[dict]) -> list[list[int]]:
    trainer._generate_and_score_completions([dict(r) for r in rows])
    return [t.turns[0].response_ids for t in trainer.last_step.trajectories]


def test_generation_settings_reach_transformers_generate(tmp_path, tiny_model_dir):
    """min_p = 1 keeps only the most likely token, so sampling at temperature 1 decodes greedily whatever the
    seed; generation_kwargs override the response limit as in TRL."""
    rows = [{"prompt": encode_task_prompt({"target": 2, "max_turns": 1})}] * 4
    dataset = Dataset.from_list(rows)

    def trainer(**overrides) -> AgentGRPOTrainer:
        values = cpu_trainer_kwargs(tmp_path / "_".join(overrides), max_completion_length=6, **overrides)
        config = AgentGRPOConfig(**values)
        return AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=dataset, env_factory=locker_factory)

    greedy, nucleus = trainer(temperature=0.0), trainer(min_p=1.0, top_k=0)
    short = trainer(generation_kwargs={"max_new_tokens": 2})
    try:
        expected = _first_responses(greedy, rows)
        for seed in (1, 2):
            torch.manual_seed(seed)
            assert _first_responses(nucleus, rows) == expected
        assert {len(ids) for ids in _first_responses(short, rows)} <= {1, 2}
        assert max(len(ids) for ids in expected) > 2  # without the override responses run longer
    finally:
        for t in (greedy, nucleus, short):
            t.close()
