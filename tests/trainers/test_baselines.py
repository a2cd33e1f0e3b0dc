"""BaselineTrainer: every comparison method's per-token advantages on one real ALFWorld batch.

One rollout batch (two scripted wins, two failures, real log-probs of a tiny policy) is shared; each test switches
the method on the same trainer and checks its advantages against numbers derived here independently: the teacher
gap from a direct forward pass of the model (not the trainer's batched scorer) and the papers' formulas by hand.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState, PartialState
from datasets import Dataset
from trl.trainer.utils import pad

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.envs.alfworld import task_spec_rows
from taspo_trl.privileged import PI_HEADER
from taspo_trl.privileged.rescoring import privileged_prompt_ids
from taspo_trl.testing import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers import BaselineConfig, BaselineTrainer
from tests.helpers.cpu_config import cpu_trainer_kwargs

MAX_TURNS = 6
A_WIN = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # GRPO on rewards [1, 1, 0, 0]: (1 - 0.5) / (unbiased std + delta)


def _config(tmp_path: Path, **overrides) -> BaselineConfig:
    return BaselineConfig(**cpu_trainer_kwargs(tmp_path / "out", max_turns=MAX_TURNS, **overrides))


def _rollout(trainer: BaselineTrainer, game: Path, dataset: Dataset, wins: int = 2) -> dict:
    """One scripted batch (``wins`` walkthrough wins, stalling failures for the rest); returns what
    ``turn_advantages`` saw, captured by a spy."""
    walkthrough = json.loads(Path(game).read_text())["walkthrough"]
    plans = walkthrough_plans(walkthrough, MAX_TURNS, wins=wins)
    generator = PlannedGenerator(trainer.model, trainer.processing_class, plans)
    original = trainer.turn_advantages
    seen: dict = {}

    def spy(step):
        seen.update(step=step, trajectories=step.trajectories, advantages=step.advantages, rows=step.rows, batch=step.batch)
        return original(step)

    trainer.turn_advantages = spy
    patched = grpo_module.generator_for_trainer
    grpo_module.generator_for_trainer = lambda _trainer, batch_size=None: generator
    try:
        trainer._generate_and_score_completions([dict(dataset[0]) for _ in range(4)])
    finally:
        grpo_module.generator_for_trainer = patched
        trainer.turn_advantages = original
    return seen


_ACCELERATE_STATES = (PartialState, AcceleratorState, GradientState)


@pytest.fixture
def shared(kept_trainer):
    """The module's one trainer and batch, with accelerate's process state as it was when the trainer was built.

    accelerate keeps that state in class-level dictionaries that any new ``TrainingArguments`` clears and
    rebuilds: under ``--dist worksteal`` another file's test can run on this worker between two of these tests and
    leave the kept trainer's ``Accelerator`` without ``num_processes``. Each test puts the kept state back first.
    """
    trainer, seen, states = kept_trainer
    for cls, state in zip(_ACCELERATE_STATES, states, strict=True):
        cls._shared_state.clear()
        cls._shared_state.update(state)
    return trainer, seen


@pytest.fixture(scope="module")
def kept_trainer(tmp_path_factory, tiny_model_dir, pick_and_place_game):
    """A trainer whose teacher context is the shipped ALFWorld skills, and one scripted batch."""
    dataset = Dataset.from_list(task_spec_rows([pick_and_place_game]))
    trainer = BaselineTrainer(
        model=tiny_model_dir, args=_config(tmp_path_factory.mktemp("b"), baseline="sdar"), train_dataset=dataset
    )
    seen = _rollout(trainer, pick_and_place_game, dataset)
    # The teacher pass depends only on the contexts and the teacher, not on the method that shapes its gaps, so
    # methods sharing both reuse it (each forward of the 49k-token LM head costs seconds on this CPU).
    scored: dict = {}
    teacher_scores = trainer._teacher_scores

    def reuse(trajectories, contexts):
        key = (tuple(contexts.items()), id(trainer.teacher_model))
        if key not in scored:
            scored[key] = teacher_scores(trajectories, contexts)
        return scored[key]

    trainer._teacher_scores = reuse
    yield trainer, seen, [dict(cls._shared_state) for cls in _ACCELERATE_STATES]
    trainer.close()


def _advantages_with(trainer: BaselineTrainer, seen: dict, **settings) -> list[list[list[float]]]:
    """Per trajectory, per turn, per token advantages of the method ``settings`` select."""
    saved = {name: getattr(trainer.args, name) for name in settings}
    for name, value in settings.items():
        setattr(trainer.args, name, value)
    try:
        out = trainer.turn_advantages(seen["step"])
    finally:
        for name, value in saved.items():
            setattr(trainer.args, name, value)
    return [[turn if isinstance(turn, list) else [turn] for turn in trajectory] for trajectory in out]


def _direct_gap(trainer: BaselineTrainer, trajectory, t: int, context: str) -> torch.Tensor:
    """Delta = log pi(y | context + h) - log pi_old(y | h) of turn ``t`` from one plain forward pass."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    turn = trajectory.turns[t]
    prompt = privileged_prompt_ids(trajectory, t, context, trainer.chat)
    ids = torch.tensor([prompt + turn.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    teacher = torch.log_softmax(logits, -1).gather(1, torch.tensor(turn.response_ids)[:, None])[:, 0]
    return teacher - torch.tensor(turn.logprobs)


def _direct_gaps(trainer: BaselineTrainer, seen: dict) -> list[list[torch.Tensor]]:
    """The gap of every turn under its trajectory's last privileged context."""
    return [
        [_direct_gap(trainer, trajectory, t, context) for t in range(trajectory.num_turns)]
        for trajectory, context in zip(seen["trajectories"], trainer.last_step.privileged_info, strict=True)
    ]


def test_teacher_gaps_have_one_plain_reference(shared):
    """The teacher gap's student term and the distillation losses' student log-probs are the trainer's one plain
    reference (TRL's recomputed log-probs when it computed them), so sampling log-probs off by a constant (another
    engine's, e.g. vLLM's) move no method's advantages."""
    trainer, seen = shared
    snapshot = seen["batch"]["sampling_per_token_logps"]  # the transformers backend: the snapshot's own log-probs
    offset = 0.75
    shifted_trajectories = copy.deepcopy(seen["trajectories"])
    for trajectory in shifted_trajectories:
        for turn in trajectory.turns:
            turn.logprobs = [value + offset for value in turn.logprobs]
    rows = seen["rows"]
    shifted_rows = copy.deepcopy(rows)
    shifted_rows.logprobs = [
        [value + offset * policy for value, policy in zip(values, mask)] for values, mask in zip(rows.logprobs, rows.env_mask)
    ]
    reference = {**seen, "batch": {**seen["batch"], "old_per_token_logps": snapshot.clone()}}
    shifted = {
        **seen,
        "trajectories": shifted_trajectories,
        "rows": shifted_rows,
        "batch": {
            **seen["batch"],
            "sampling_per_token_logps": pad([torch.tensor(v) for v in shifted_rows.logprobs], 0.0, "right"),
            "old_per_token_logps": snapshot.clone(),
        },
    }
    for method in ("opsd", "grpo_opsd", "sdar", "skill_sd", "rlsd", "opid", "stepopsd"):
        want = _advantages_with(trainer, reference, baseline=method, pi_source="generic_skill")
        assert _advantages_with(trainer, shifted, baseline=method, pi_source="generic_skill") == want, method


def test_batch_has_two_wins_and_skill_contexts(shared):
    trainer, seen = shared
    assert [t.won for t in seen["trajectories"]] == [True, True, False, False]
    assert seen["advantages"].tolist() == pytest.approx([A_WIN, A_WIN, -A_WIN, -A_WIN], abs=1e-5)
    _advantages_with(trainer, seen, baseline="opsd")
    assert all(context.startswith("[Skills]") or "- " in context for context in trainer.last_step.privileged_info)


def test_distillation_methods_add_their_gradient_equivalent_term(shared):
    trainer, seen = shared
    gaps = _direct_gaps(trainer, seen)
    advantages = seen["advantages"].tolist()
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert trainer.state.global_step == 0  # the first update: verl's global_steps 1
    lam = 0.5 * (1 - 1 / 50)  # official RLSD lambda at global_steps 1: 0.49
    expected = {
        "opsd": lambda a, d: 1.0 * d,  # reverse KL only, no reward: A_t = lambda Delta_t
        "grpo_opsd": lambda a, d: a + 0.1 * d,
        "sdar": lambda a, d: a + 0.01 * sigmoid(5 * d),  # official compute_sdar_loss: -d/dlogp = coef * gate >= 0
        "skill_sd": lambda a, d: a + 0.1 * d,  # importance weight 1 at the snapshot
        "rlsd": lambda a, d: a * ((1 - lam) + lam * min(max(math.exp(math.copysign(1, a) * d), 0.8), 1.2)),
    }
    coefs = {"opsd": 1.0, "grpo_opsd": 0.1, "sdar": 0.01, "skill_sd": 0.1, "rlsd": 0.0}
    for method, formula in expected.items():
        got = _advantages_with(trainer, seen, baseline=method, distill_coef=coefs[method], teacher_sync_steps=1)
        for i, trajectory in enumerate(got):
            for t, turn in enumerate(trajectory):
                want = [formula(advantages[i], float(d)) for d in gaps[i][t]]
                assert turn == pytest.approx(want, abs=2e-4), (method, i, t)


def test_rlsd_never_flips_the_sign_and_stays_in_its_band(shared):
    trainer, seen = shared
    got = _advantages_with(trainer, seen, baseline="rlsd")
    for a, trajectory in zip(seen["advantages"].tolist(), got, strict=True):
        for value in (v for turn in trajectory for v in turn):
            assert math.copysign(1, value) == math.copysign(1, a)
            # first update: lambda 0.49, eps 0.2 -> factor in [0.51 + 0.49 * 0.8, 0.51 + 0.49 * 1.2]
            assert 0.902 * abs(a) - 1e-6 <= abs(value) <= 1.098 * abs(a) + 1e-6


def test_opd_with_the_policy_as_its_own_teacher_gives_zero_advantages(shared):
    trainer, seen = shared
    trainer.teacher_model = trainer.model
    try:
        got = _advantages_with(trainer, seen, baseline="opd", distill_coef=1.0)
    finally:
        trainer.teacher_model = None
    assert max(abs(v) for trajectory in got for turn in trajectory for v in turn) < 1e-4


def test_stepopsd_keeps_each_trajectorys_sign_and_token_mean(shared):
    trainer, seen = shared
    got = _advantages_with(trainer, seen, baseline="stepopsd", pi_source="generic_skill")
    for a, trajectory in zip(seen["advantages"].tolist(), got, strict=True):
        values = [v for turn in trajectory for v in turn]
        assert all(math.copysign(1, v) == math.copysign(1, a) for v in values)
        assert sum(values) / len(values) == pytest.approx(a, rel=1e-4)
        assert len(set(round(v, 6) for v in values)) > 1  # credit actually moved between steps


def test_gigpo_first_step_anchor_group_by_hand(shared):
    trainer, seen = shared
    trajectories = seen["trajectories"]
    n = trajectories[0].num_turns  # the walkthrough; sibling 1 takes one detour step more
    assert trajectories[1].num_turns == n + 1
    lengths = [t.num_turns for t in trajectories]
    # The environment pays 1 on the winning step only, so each episode score (the sum of its step rewards) is won.
    for t in trajectories:
        assert [turn.reward for turn in t.turns] == [0.0] * (t.num_turns - 1) + [float(t.won)]
    # A_E (verl-agent episode_norm_reward, "mean" norm): the episode score minus the mean over the group's step
    # rows, where a trajectory of n steps counts n times: mean = (n + (n + 1)) / (total rows).
    rows_mean = (n + (n + 1)) / sum(lengths)
    a_e = [1 - rows_mean, 1 - rows_mean, -rows_mean, -rows_mean]
    got = _advantages_with(trainer, seen, baseline="gigpo")
    # Turn 0 of all four siblings acts on the same intro text, their anchor group. Discounted returns at turn 0:
    # 0.95^(n-1) and 0.95^n for the winners, 0 for the failures; A_S = return - group mean ("mean" norm).
    mean = (0.95 ** (n - 1) + 0.95**n) / 4
    assert got[0][0][0] == pytest.approx(a_e[0] + 0.95 ** (n - 1) - mean, abs=1e-6)
    assert got[1][0][0] == pytest.approx(a_e[1] + 0.95**n - mean, abs=1e-6)
    assert got[2][0][0] == pytest.approx(a_e[2] - mean, abs=1e-6)
    assert got[3][0][0] == pytest.approx(a_e[3] - mean, abs=1e-6)
    # omega = 0 leaves GiGPO's own A_E on every turn, not the trainer's GRPO advantage.
    no_step_term = _advantages_with(trainer, seen, baseline="gigpo", gigpo_omega=0.0)
    for want, trajectory in zip(a_e, no_step_term, strict=True):
        assert all(v == pytest.approx(want, abs=1e-6) for turn in trajectory for v in turn)
    assert a_e[0] != pytest.approx(seen["advantages"][0].item(), abs=1e-3)
    # "mean_std" divides both terms by their unbiased std + 1e-6: the rows' std of A_E's scores ...
    total = sum(lengths)
    rows_std = math.sqrt(((2 * n + 1) * (1 - rows_mean) ** 2 + (total - 2 * n - 1) * rows_mean**2) / (total - 1))
    # ... and turn 0's anchor group {0.95^(n-1), 0.95^n, 0, 0}
    returns = [0.95 ** (n - 1), 0.95**n, 0.0, 0.0]
    anchor_std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 3)
    scaled = _advantages_with(trainer, seen, baseline="gigpo", gigpo_norm="mean_std")
    for i in range(4):
        want = a_e[i] / (rows_std + 1e-6) + (returns[i] - mean) / (anchor_std + 1e-6)
        assert scaled[i][0][0] == pytest.approx(want, abs=1e-5), i


def test_opid_adds_the_episode_gap_and_its_step_skill_gaps(shared):
    """OPID: A'_t = A + w_e Delta_episode_t + w_s Delta_step_t. The episode context is the analyzer's aligned
    guidance; the analyzer writes at most 5 step skills per trajectory, and a step's tokens are rescored under its
    own skill (weights raised to 1 here so both terms show at the test's tolerance)."""
    trainer, seen = shared
    got = _advantages_with(
        trainer, seen, baseline="opid", pi_source="aligned", opid_episode_weight=1.0, opid_step_weight=1.0
    )
    episode, steps, trajectories = trainer.last_step.privileged_info, trainer.last_step.step_skills, seen["trajectories"]
    assert sum(map(len, steps)) >= 2 and all(len(skills) <= 5 for skills in steps)
    step_gaps = {}
    for i, (a, trajectory) in enumerate(zip(seen["advantages"].tolist(), got, strict=True)):
        assert set(steps[i]) <= set(range(trajectories[i].num_turns))
        for t, turn in enumerate(trajectory):
            if not episode[i] and t not in steps[i]:
                assert turn == [pytest.approx(a)]
                continue
            zero = torch.zeros(len(trajectories[i].turns[t].response_ids))
            e = _direct_gap(trainer, trajectories[i], t, episode[i]) if episode[i] else zero
            if t in steps[i]:
                step_gaps[(i, t)] = _direct_gap(trainer, trajectories[i], t, steps[i][t])
            d = step_gaps.get((i, t), zero)
            assert turn == pytest.approx([a + float(x) + float(y) for x, y in zip(e, d)], abs=2e-4), (i, t)
    episode_only = _advantages_with(
        trainer, seen, baseline="opid", pi_source="aligned", opid_episode_weight=1.0, opid_max_step_skills=0
    )
    assert trainer.last_step.step_skills == [{}] * len(trajectories)
    for (i, t), step_gap in step_gaps.items():
        assert [x - y for x, y in zip(got[i][t], episode_only[i][t])] == pytest.approx(step_gap.tolist(), abs=2e-4)
    # Well above the 2e-4 tolerance, so leaving the step term out would fail the checks above.
    assert max(gap.abs().max().item() for gap in step_gaps.values()) > 1e-3


def test_skill_sd_teacher_sees_skills_from_the_successes_not_a_raw_sibling(shared):
    trainer, seen = shared
    got = _advantages_with(trainer, seen, baseline="skill_sd", pi_source="success_skills", distill_coef=0.1)
    contexts = trainer.last_step.privileged_info
    assert all(context.startswith(PI_HEADER) and "step 1:" not in context for context in contexts)
    gaps = _direct_gaps(trainer, seen)
    for i, (a, trajectory) in enumerate(zip(seen["advantages"].tolist(), got, strict=True)):
        for t, turn in enumerate(trajectory):
            assert turn == pytest.approx([a + 0.1 * float(d) for d in gaps[i][t]], abs=2e-4), (i, t)


def test_skill_grpo_shows_skills_to_the_policy_and_keeps_grpo_credit(tmp_path, tiny_model_dir, pick_and_place_game):
    dataset = Dataset.from_list(task_spec_rows([pick_and_place_game]))
    trainer = BaselineTrainer(model=tiny_model_dir, args=_config(tmp_path, baseline="skill_grpo"), train_dataset=dataset)
    try:
        seen = _rollout(trainer, pick_and_place_game, dataset)
        got = trainer.turn_advantages(seen["step"])
    finally:
        trainer.close()
    assert all("[Skills]" in turn.prompt_text for t in seen["trajectories"] for turn in t.turns)
    for a, trajectory in zip(seen["advantages"].tolist(), got, strict=True):
        assert trajectory == [pytest.approx(a)] * len(trajectory)


# The comparison methods' launchers of the official code (SDAR's examples/{sdar,rlsd}_trainer/run_*_3b.sh and
# verl-agent's examples/gigpo_trainer/run_*.sh, which SDAR ships), per benchmark. RLSD's decay length is the default
# of the RLSDRayTrainer that Align-OPSD ships (50; SDAR's launchers override it with 100).
OFFICIAL_LAUNCHERS = {
    "sdar": {env: {"distill_coef": 0.01, "sdar_beta": 5.0} for env in ("alfworld", "webshop", "search")},
    "rlsd": {
        env: {"rlsd_lambda": 0.5, "rlsd_decay_steps": 50, "rlsd_clip": 0.2} for env in ("alfworld", "webshop", "search")
    },
    "gigpo": {
        env: {"gigpo_omega": 1.0, "gigpo_gamma": 0.95, "gigpo_norm": norm, "gigpo_similarity_threshold": similarity}
        for env, norm, similarity in (("alfworld", "mean_std", None), ("webshop", "mean", None), ("search", "mean_std", 0.9))
    },
}


@pytest.mark.parametrize("method", sorted(OFFICIAL_LAUNCHERS))
def test_baseline_recipes_follow_the_official_launchers(method):
    import yaml

    recipes = Path(__file__).resolve().parents[2] / "taspo_trl" / "recipes"
    paths = sorted(recipes.glob(f"paper/*/{method}_*.yaml")) + sorted(recipes.glob(f"quickstart/*_{method}_cpu.yaml"))
    assert len(paths) >= 3, paths
    for path in paths:
        data = yaml.safe_load(path.read_text())
        want = OFFICIAL_LAUNCHERS[method][data["environment"]]
        assert {key: data.get(key) for key in want} == want, path.name


def test_bad_settings_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match="baseline must be one of"):
        _config(tmp_path, baseline="ppo")
    with pytest.raises(ValueError, match="teacher_model_name_or_path"):
        _config(tmp_path, baseline="opd")
    with pytest.raises(ValueError, match="teacher_policy"):
        _config(tmp_path, baseline="opsd", teacher_policy="ema")
    with pytest.raises(ValueError, match="opid_max_step_skills must be >= 0"):
        _config(tmp_path, baseline="opid", opid_max_step_skills=-1)
    with pytest.raises(ValueError, match="gigpo_norm must be one of"):
        _config(tmp_path, baseline="gigpo", gigpo_norm="std")
    with pytest.raises(ValueError, match="gigpo_similarity_threshold must be in"):
        _config(tmp_path, baseline="gigpo", gigpo_similarity_threshold=1.0)


def test_teacher_sync_steps_and_teacher_policy_are_one_setting(tmp_path):
    def schedule(**settings):
        config = _config(tmp_path, **settings)
        return config.teacher_policy, config.teacher_sync_steps

    assert schedule(baseline="skill_sd") == ("periodic", 10)  # Skill-SD's teacher is synced periodically
    assert _config(tmp_path, baseline="skill_sd").pi_source == "success_skills"
    assert schedule(baseline="opsd") == ("initial", 0) and schedule(baseline="sdar") == ("current", 1)
    assert schedule(baseline="skill_sd", teacher_sync_steps=4) == ("periodic", 4)
    assert schedule(baseline="skill_sd", teacher_sync_steps=1) == ("current", 1)
    assert schedule(baseline="skill_sd", teacher_sync_steps=0) == ("initial", 0)
    assert schedule(baseline="sdar", teacher_policy="periodic") == ("periodic", 10)
    assert schedule(baseline="opsd", teacher_policy="initial", teacher_sync_steps=0) == ("initial", 0)
    with pytest.raises(ValueError, match="teacher_sync_steps must be an integer >= 0"):
        _config(tmp_path, baseline="skill_sd", teacher_sync_steps=-2)
    with pytest.raises(ValueError, match="contradicts teacher_sync_steps=5"):
        _config(tmp_path, baseline="skill_sd", teacher_policy="initial", teacher_sync_steps=5)
    with pytest.raises(ValueError, match="OPD's teacher is teacher_model_name_or_path"):
        _config(tmp_path, baseline="opd", teacher_model_name_or_path="x", teacher_sync_steps=3)


def _nudge(model: torch.nn.Module, seed: int) -> None:
    """Move every trainable weight, as an optimizer step would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_periodic_teacher_is_a_frozen_copy_refreshed_every_n_steps(tmp_path, tiny_model_dir, pick_and_place_game, lora):
    """teacher_sync_steps = 2: the teacher holds the policy of step 0 through step 1, that of step 2 from step 2
    on (a frozen copy of the whole model, or under LoRA a second, frozen adapter)."""
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj"])
    trainer = BaselineTrainer(
        model=tiny_model_dir,
        args=_config(tmp_path, baseline="skill_sd", teacher_sync_steps=2),
        train_dataset=Dataset.from_list(task_spec_rows([pick_and_place_game])),
        peft_config=peft_config,
    )
    try:
        assert (trainer.teacher_model is None) == lora  # LoRA keeps no second copy of the base model
        ids = torch.tensor([trainer.processing_class.encode("You arrive at countertop 1. take apple 1")])
        mask = torch.ones_like(ids)

        def scores() -> tuple[torch.Tensor, torch.Tensor]:
            trainer._sync_teacher()
            with torch.no_grad():
                return trainer._teacher_logprobs(ids, mask, 5), trainer._snapshot_logprobs(ids, mask, 5)

        policy = trainer.accelerator.unwrap_model(trainer.model)
        teacher, student = scores()
        torch.testing.assert_close(teacher, student)  # step 0: the copy is the policy
        _nudge(policy, 0)
        trainer.state.global_step = 1
        stale, student = scores()
        torch.testing.assert_close(stale, teacher)  # not refreshed yet: still the step-0 policy
        assert (stale - student).abs().max() > 1e-3
        trainer.state.global_step = 2
        refreshed, student = scores()
        torch.testing.assert_close(refreshed, student)
        _nudge(policy, 1)
        trainer.state.global_step = 3
        held, student = scores()
        torch.testing.assert_close(held, refreshed)
        assert (held - student).abs().max() > 1e-3
        mode = "train" if trainer.model.training else "eval"
        assert trainer._metrics[mode]["baseline/teacher_version"] == [0.0, 0.0, 2.0, 2.0]
        if lora:  # the teacher adapter never trains, and the policy's adapter is active again after a teacher pass
            grads = {name: p.requires_grad for name, p in policy.named_parameters() if "lora_" in name}
            assert not any(g for name, g in grads.items() if ".teacher." in name)
            assert all(g for name, g in grads.items() if ".default." in name)
    finally:
        trainer.close()


def test_a_non_finite_log_prob_leaves_its_turn_unscored(shared):
    trainer, seen = shared
    trajectories, rows = seen["trajectories"], seen["rows"]
    plain = copy.deepcopy(rows.collect(seen["batch"]["sampling_per_token_logps"]))
    plain[(0, 1)][0] = float("nan")
    contexts = trainer.last_step.privileged_info or trainer._privileged_info(seen["step"])
    gaps = trainer._teacher_gaps(trajectories, trainer._turn_contexts(trajectories, contexts), plain)
    assert (0, 1) not in gaps and (0, 0) in gaps
    mode = "train" if trainer.model.training else "eval"
    assert trainer._metrics[mode]["baseline/non_finite_gap_turns"][-1] == 1.0


def test_an_all_fail_batch_runs_no_plain_pass(tmp_path, tiny_model_dir, pick_and_place_game, monkeypatch):
    """OPID's teacher contexts (aligned PI and step skills) come from successful siblings: with none, no turn has a
    teacher gap, so no row's plain log-probs are read, and none may be computed, even when the sampler ran under
    bf16 autocast and only a forward pass could give them."""
    dataset = Dataset.from_list(task_spec_rows([pick_and_place_game]))
    trainer = BaselineTrainer(model=tiny_model_dir, args=_config(tmp_path, baseline="opid"), train_dataset=dataset)
    monkeypatch.setattr(trainer.args, "bf16", True)
    passes = []
    snapshot = trainer._snapshot_logprobs
    monkeypatch.setattr(trainer, "_snapshot_logprobs", lambda *args, **kwargs: passes.append(1) or snapshot(*args, **kwargs))
    try:
        seen = _rollout(trainer, pick_and_place_game, dataset, wins=0)
    finally:
        trainer.close()
    assert not any(t.won for t in seen["trajectories"]) and seen["advantages"].abs().sum() == 0
    assert not any(trainer.last_step.privileged_info)
    assert passes == []


def test_a_baselines_model_card_links_its_own_paper_not_grpos(tmp_path, tiny_model_dir, pick_and_place_game):
    """GiGPO's card names GiGPO and links its arXiv id (Feng et al., 2505.10978), not the DeepSeekMath id
    (2402.03300) that TRL's GRPOTrainer cites."""
    dataset = Dataset.from_list(task_spec_rows([pick_and_place_game]))
    trainer = BaselineTrainer(model=tiny_model_dir, args=_config(tmp_path, baseline="gigpo"), train_dataset=dataset)
    try:
        trainer.create_model_card(model_name="tiny-gigpo")
    finally:
        trainer.close()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trained with **GiGPO**" in card
    assert "The method is from [Feng et al.](https://huggingface.co/papers/2505.10978)" in card
    assert "2402.03300" not in card
    assert "gigpo" in card.split("---")[1]  # the method's tag


def test_another_test_on_this_worker_resets_accelerates_state(tmp_path):
    """What a test of another file does when it runs on this worker between two tests here (``--dist
    worksteal``): new ``TrainingArguments``, which clear accelerate's shared process state and build their own.
    The next test checks that the kept trainer survives it."""
    BaselineConfig(**cpu_trainer_kwargs(tmp_path / "other", baseline="gigpo")).device  # noqa: B018 - builds the state
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_the_kept_trainer_works_after_another_test_reset_accelerates_state(shared):
    trainer, seen = shared
    assert trainer.accelerator.num_processes == 1 and trainer.accelerator.is_main_process
    got = _advantages_with(trainer, seen, baseline="gigpo")
    assert [len(t) for t in got] == [t.num_turns for t in seen["trajectories"]]
