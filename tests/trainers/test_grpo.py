"""AgentGRPOTrainer: the rows it builds are the tokens the policy saw, and it trains (with and without LoRA)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt
from taspo_trl.testing import PlannedGenerator
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.toy_envs import locker_factory


def _dataset(n_tasks: int = 2) -> Dataset:
    return Dataset.from_list([{"prompt": encode_task_prompt({"target": 1 + k % 5, "max_turns": 3})} for k in range(n_tasks)])


def _config(tmp_path, layout: str, **overrides) -> AgentGRPOConfig:
    values = dict(layout=layout, max_completion_length=16, gradient_checkpointing=True)
    values.update(overrides)
    return AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path / "out", **values))


@pytest.mark.parametrize("layout", ["turn", "sequence"])
def test_recomputed_logprobs_match_sampling_logprobs(tmp_path, tiny_model_dir, layout):
    trainer = AgentGRPOTrainer(
        model=tiny_model_dir, args=_config(tmp_path, layout), train_dataset=_dataset(), env_factory=locker_factory
    )
    try:
        rows = [dict(r) for r in _dataset(1)] * 4
        batch = trainer._generate_and_score_completions(rows)
    finally:
        trainer.close()
    trajectories = trainer.last_step.trajectories
    n_rows = 4 if layout == "sequence" else sum(t.num_turns for t in trajectories)
    assert batch["completion_ids"].size(0) >= n_rows
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention, batch["completion_ids"].size(1), batch_size=4
        )
    policy = (batch["tool_mask"] > 0) & (batch["completion_mask"] > 0)
    assert policy.sum() == sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    diff = (logps - batch["sampling_per_token_logps"]).abs()[policy]
    assert diff.max().item() < 1e-3
    # Eq. 7: each trajectory's token weights sum to 1, so the dapo normalizer counts trajectories
    assert batch["num_items_in_batch"].item() == pytest.approx(sum(1 for t in trajectories if t.turns))


LOCKER_PLANS = [  # the locker task of ``_dataset(1)`` (target 1): two siblings win, two never find the key
    ["open locker 1"],
    ["open locker 4", "open locker 1"],
    ["open locker 2", "open locker 3", "open locker 5"],
    [None, "open locker 2", None],
]


@pytest.mark.parametrize("layout,use_peft", [("turn", False), ("sequence", False), ("turn", True)])
def test_trains_one_step(tmp_path, tiny_model_dir, monkeypatch, layout, use_peft):
    """One optimizer step on a group with wins and failures (scripted actions, the policy's real log-probs): the
    outcome advantages are non-zero, so the trained parameters (LoRA's only, with PEFT) must move."""
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if use_peft else None
    trainer = AgentGRPOTrainer(
        model=tiny_model_dir,
        args=_config(tmp_path, layout, beta=0.01 if use_peft else 0.0),
        train_dataset=_dataset(1),
        env_factory=locker_factory,
        peft_config=peft_config,
    )
    generator = PlannedGenerator(trainer.model, trainer.processing_class, LOCKER_PLANS)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    try:
        trainer.train()
    finally:
        trainer.close()
    logged = trainer.state.log_history[0]
    assert [t.won for t in trainer.last_step.trajectories] == [True, True, False, False]
    assert logged["success/all"] == 0.5 and logged["reward_std"] > 0
    assert torch.isfinite(torch.tensor(logged["loss"]))
    after = dict(trainer.model.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n].detach())]
    if use_peft:  # LoRA's B starts at 0, so A's gradient is 0 at the first step; B must move
        assert before and all("lora" in n for n in before)
        assert {n for n in before if "lora_B" in n} <= set(changed)
    else:
        assert changed == list(before)  # every trained tensor gets a gradient from the policy tokens


def test_config_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="loss_type='dapo'"):
        _config(tmp_path, "turn", loss_type="grpo")
    with pytest.raises(ValueError, match="layout"):
        _config(tmp_path, "rows")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use_vllm: false"):
            _config(tmp_path, "turn", use_vllm=True)


def test_turn_table_and_completions_log(tmp_path, tiny_model_dir):
    trainer = AgentGRPOTrainer(
        model=tiny_model_dir,
        args=_config(tmp_path, "turn", log_turns=True, log_completions=True),
        train_dataset=_dataset(),
        env_factory=locker_factory,
    )
    try:
        trainer._generate_and_score_completions([dict(r) for r in _dataset(1)] * 4)
    finally:
        trainer.close()
    import json

    trajectories = trainer.last_step.trajectories
    lines = [json.loads(line) for line in (tmp_path / "out" / "turns.jsonl").read_text().splitlines()]
    assert len(lines) == sum(t.num_turns for t in trajectories)
    assert {line["task"] for line in lines} == {"find the key in one of the lockers"}
    assert list(trainer._logs["prompt"]) == [t.task for t in trajectories]
    per_turn = list(trainer._logs["extra"]["turn_advantages"])
    assert [len(s.split(", ")) for s in per_turn] == [t.num_turns for t in trajectories]


def test_cpu_logprobs_match_trls_fused_head(tmp_path, tiny_model_dir):
    """On CPU the trainer scores only the completion's positions; TRL's fused head scores every position. Same
    log-probs, entropies and gradients, at a sampling temperature other than 1."""
    from trl import GRPOTrainer

    trainer = AgentGRPOTrainer(
        model=tiny_model_dir, args=_config(tmp_path, "turn", temperature=0.7), train_dataset=_dataset(), env_factory=locker_factory
    )
    try:
        batch = trainer._generate_and_score_completions([dict(r) for r in _dataset(1)] * 4)
    finally:
        trainer.close()
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    parameters = [p for p in trainer.model.parameters() if p.requires_grad]
    results = []
    for compute in (AgentGRPOTrainer._get_per_token_logps_and_entropies, GRPOTrainer._get_per_token_logps_and_entropies):
        logps, entropies, _ = compute(trainer, trainer.model, input_ids, attention, width, batch_size=3, compute_entropy=True)
        surrogate = (logps * batch["advantages"] * batch["tool_mask"]).sum() + (entropies * batch["completion_mask"]).sum()
        results.append((logps.detach(), entropies.detach(), torch.autograd.grad(surrogate, parameters)))
    (ours, our_entropy, our_grads), (trl, trl_entropy, trl_grads) = results
    assert ours.shape == trl.shape == batch["completion_ids"].shape
    assert torch.allclose(ours, trl, atol=1e-5) and torch.allclose(our_entropy, trl_entropy, atol=1e-4)
    for a, b in zip(our_grads, trl_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_each_run_gets_its_own_turns_log_and_earlier_ones_are_kept(tmp_path):
    from taspo_trl.trainers.grpo import start_turns_log

    out = tmp_path / "out"
    first = start_turns_log(str(out), resumed=False)
    with open(first, "a") as handle:
        handle.write('{"run": 1}\n')
    second = start_turns_log(str(out), resumed=False)
    with open(second, "a") as handle:
        handle.write('{"run": 2}\n')
    resumed = start_turns_log(str(out), resumed=True)
    with open(resumed, "a") as handle:
        handle.write('{"run": 2, "resumed": true}\n')
    third = start_turns_log(str(out), resumed=False)
    assert first == second == resumed == third == str(out / "turns.jsonl")
    assert (out / "turns.1.jsonl").read_text() == '{"run": 1}\n'
    assert (out / "turns.2.jsonl").read_text() == '{"run": 2}\n{"run": 2, "resumed": true}\n'
    assert not (out / "turns.jsonl").exists()  # the third run has not written yet


def test_a_lora_output_loads_evaluates_and_trains_further(tmp_path, tiny_model_dir, monkeypatch):
    """A LoRA run's saved output is an adapter folder (no config.json). Every model path takes it: the reference
    check passes, the loader gives the policy the trained adapter computes (PEFT's own unmerged forward pass is the
    expectation), and a new trainer starts from that policy."""
    from peft import LoraConfig

    from taspo_trl.models import check_model_reference, is_adapter_folder, load_model_and_tokenizer

    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    trainer = AgentGRPOTrainer(
        model=tiny_model_dir, args=_config(tmp_path, "turn", beta=0.01), train_dataset=_dataset(1),
        env_factory=locker_factory, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    generator = PlannedGenerator(trainer.model, trainer.processing_class, LOCKER_PLANS)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    try:
        trainer.train()
        with torch.no_grad():  # one step at 1e-4 barely moves B; a larger update shows whether the merge keeps it
            generator_seed = torch.Generator().manual_seed(0)
            for name, parameter in trainer.model.named_parameters():
                if "lora_B" in name:
                    parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator_seed))
        saved = tmp_path / "lora_output"
        trainer.save_model(str(saved))
    finally:
        trainer.close()
    assert is_adapter_folder(str(saved)) and not (saved / "config.json").exists()
    card = (saved / "README.md").read_text()  # ours, not PEFT's blank card
    assert "# lora_output" in card and "library_name: peft" in card and "Agent GRPO" in card
    assert "[None]" not in card and '"None"' not in card and "More Information Needed" not in card
    assert "| `beta` | `0.01` |" in card and "| `success/all` | 0.5 |" in card
    check_model_reference(str(saved))
    ids = torch.tensor([[1, 5, 9, 200, 31, 7]])
    trained = trainer.model.eval()
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        with trained.disable_adapter():  # dropping the adapter would be noticed
            assert (trained(input_ids=ids).logits - expected).abs().max() > 1e-2
    model, tokenizer = load_model_and_tokenizer(str(saved))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=1e-4, rtol=0)
    assert tokenizer.padding_side == "left"

    further = AgentGRPOTrainer(model=str(saved), args=_config(tmp_path / "again", "turn"), train_dataset=_dataset(1),
                               env_factory=locker_factory)
    try:
        with torch.no_grad():
            torch.testing.assert_close(further.model(input_ids=ids).logits, expected, atol=1e-4, rtol=0)
    finally:
        further.close()


def test_the_trainer_takes_a_model_by_the_names_the_cli_takes(tmp_path, embedded_model_path):
    """As TRL takes a hub id, the trainers take this package's model names: "embedded" loads the converted embedded
    model (as ``taspo-train``'s ``model_name_or_path: embedded`` does), a path loads as it is."""
    by_name = AgentGRPOTrainer(model="embedded", args=_config(tmp_path / "a", "turn"), train_dataset=_dataset(1),
                               env_factory=locker_factory)
    try:
        assert by_name.model.name_or_path == embedded_model_path
        assert by_name.model.config.num_hidden_layers == 30  # SmolLM2-135M, not a stand-in
    finally:
        by_name.close()


def test_a_trl_prompt_dataset_is_refused_before_the_model_loads(tmp_path):
    """A standard TRL dataset (prompt + answer) under the default ALFWorld environment would start no episode
    and train on reward 0; it is refused in one line naming the fixes."""
    rows = Dataset.from_list([{"prompt": "What is 2 + 2?", "answer": "4"}] * 2)
    with pytest.raises(ValueError) as info:
        AgentGRPOTrainer(model="/nonexistent/model", args=_config(tmp_path, "turn"), train_dataset=rows)
    message = str(info.value)
    assert "not a task of environment 'alfworld'" in message and "['answer', 'prompt']" in message
    assert "lacks 'game_file'" in message
    assert "environment_factory=" in message and "\n" not in message


def test_own_reward_functions_add_to_the_verified_reward(tmp_path, tiny_model_dir, monkeypatch):
    """As with TRL's environment_factory, reward functions passed with a built-in or own environment are summed
    with the environment's verified reward, which comes last (a reward_weights entry of 0 drops it)."""

    def brevity(completions, num_turns, **kwargs):
        return [-float(n) for n in num_turns]

    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=_config(tmp_path, "turn"), train_dataset=_dataset(1),
                               env_factory=locker_factory, reward_funcs=[brevity])
    generator = PlannedGenerator(trainer.model, trainer.processing_class, LOCKER_PLANS)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    try:
        assert trainer.reward_func_names == ["brevity", "environment_reward"]
        rows = [dict(r) for r in _dataset(1)] * 4
        trainer._generate_and_score_completions(rows)
        trajectories = trainer.last_step.trajectories
        _, total = trainer._trajectory_rewards([dict(r) for r in rows], trajectories)
    finally:
        trainer.close()
    assert [(t.won, t.num_turns) for t in trajectories] == [(True, 1), (True, 2), (False, 3), (False, 3)]
    assert total.tolist() == [0.0, -1.0, -3.0, -3.0]  # won (1 or 0) minus the turns taken
