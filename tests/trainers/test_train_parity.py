"""`taspo-train` does what TRL's `trl grpo` script does: ModelConfig's dtype and attention implementation reach
the model, every recipe states its dtype, a run resumes from a checkpoint exactly where it stopped, the end of
training writes a model card naming the method and its paper, and push_to_hub without a reachable Hub stops
before any work. Tiny random-weight policy, real ALFWorld engine, rule-based analyzer; nothing is pushed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback
from trl.trainer.utils import RepeatSampler

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.cli import build_trainer, train_main
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.recipes import recipe_files
from taspo_trl.testing import PlannedGenerator, walkthrough_plans
from taspo_trl.trainers.sampling import EpochReplaySampler

TASPO_PAPER = "Reconciling Process Supervision with Outcome-Based Credit in Agentic Policy Optimization"
MAX_TURNS = 6  # the longer walkthrough (5 steps) plus the detour of walkthrough_plans


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory) -> Path:
    """Two games of different families, so the data order decides which task a step trains on."""
    out = tmp_path_factory.mktemp("parity_games")
    generate_games(out, per_type=1, seed=0, split="train", task_types=["pick_and_place_simple", "look_at_obj_in_light"])
    return out


def _argv(recipe: str, out: Path, games_dir: Path, *extra: str) -> list[str]:
    """A quickstart recipe cut to one task and four siblings per step, with short episodes."""
    return [
        "--config", recipe, "--output_dir", str(out), "--games_dir", str(games_dir), "--report_to", "none",
        "--num_generations", "4", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
        "--max_turns", "2", "--max_completion_length", "8", *extra,
    ]


def _length_reward(completions: list, **kwargs) -> list[float]:
    """Differs between siblings (a random policy never wins), so the step has advantages and updates weights."""
    return [float(len(text)) for text in completions]


def test_bfloat16_reaches_the_trained_model(tmp_path, games_dir, tiny_model_dir):
    """The tiny model is saved in float32; `--dtype bfloat16` loads, trains and keeps it in bfloat16."""
    argv = _argv("alfworld_grpo_cpu", tmp_path / "out", games_dir, "--dtype", "bfloat16", "--max_steps", "1",
                 "--learning_rate", "1e-2")
    trainer = build_trainer(argv, model_override=tiny_model_dir, reward_funcs=[_length_reward])
    try:
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()
    finally:
        trainer.close()
    assert trainer.state.global_step == 1
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())  # it trained


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attn_implementation_reaches_the_model_config(attn, tmp_path, games_dir, tiny_model_dir):
    argv = _argv("alfworld_grpo_cpu", tmp_path / "out", games_dir, "--attn_implementation", attn)
    trainer = build_trainer(argv, model_override=tiny_model_dir)
    try:
        assert trainer.model.config._attn_implementation == attn
        assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # the CPU recipe's dtype
    finally:
        trainer.close()


def test_every_recipe_states_its_dtype():
    """bfloat16 weights for the paper's GPU runs, float32 weights for the CPU quickstarts (TRL's default, stated
    anyway). The paper's runs compute under bf16 autocast; the CPU quickstarts leave bf16 unset, so it follows the
    hardware (``taspo_trl.precision``)."""
    training = {name: path for name, path in recipe_files().items() if not name.startswith("accelerate/")}
    assert len(training) > 80
    for name, path in training.items():
        data = yaml.safe_load(path.read_text())
        assert data.get("dtype") == ("bfloat16" if name.startswith("paper/") else "float32"), name
        if name.startswith("paper/"):
            assert data["bf16"] is True, name
        else:
            assert "bf16" not in data, name


def test_hub_options_pass_through(tmp_path, games_dir, tiny_model_dir):
    argv = _argv("alfworld_taspo_cpu", tmp_path / "out", games_dir, "--hub_model_id", "someone/tiny-taspo",
                 "--hub_strategy", "checkpoint", "--hub_private_repo", "true", "--hub_revision", "v1")
    trainer = build_trainer(argv, model_override=tiny_model_dir)
    try:
        args = trainer.args
        assert (args.hub_model_id, args.hub_strategy, args.hub_private_repo, args.hub_revision) == (
            "someone/tiny-taspo", "checkpoint", True, "v1")
        assert args.push_to_hub is False
    finally:
        trainer.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_push_to_hub_without_a_reachable_hub_stops_before_any_work(tmp_path, games_dir, tiny_model_dir, monkeypatch,
                                                                   capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    out = tmp_path / "out"
    argv = _argv("alfworld_taspo_cpu", out, games_dir, "--model_name_or_path", tiny_model_dir, "--push_to_hub", "true",
                 "--hub_model_id", "someone/tiny-taspo", "--hub_token", "hf_not_a_real_token", "--max_steps", "1")
    with pytest.raises(SystemExit) as stopped:
        train_main(argv)
    message = str(stopped.value)
    assert message.startswith("taspo-train: error: push_to_hub needs a reachable Hugging Face Hub")
    assert "\n" not in message and "Drop --push_to_hub" in message
    assert not out.exists()  # stopped before the trainer was built
    assert "[taspo-train] method=" not in capsys.readouterr().out


def test_training_writes_a_model_card_naming_the_method_and_its_paper(tmp_path, games_dir, tiny_model_dir):
    out = tmp_path / "tiny-taspo"
    train_main(_argv("alfworld_taspo_cpu", out, games_dir, "--model_name_or_path", tiny_model_dir, "--max_steps", "1"))
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert {"taspo", "taspo-trl", "trl"} <= set(header["tags"])
    assert header["model_name"] == "tiny-taspo"
    assert "trained with **TASPO**" in card and "| `max_steps` | `1` |" in card  # the method and its recipe
    assert TASPO_PAPER in card  # the citation block
    assert (out / "model.safetensors").is_file()


def test_epoch_replay_sampler_draws_each_epochs_order_after_a_restart():
    """A sampler rebuilt at epoch 2 (as on resume) yields what an uninterrupted one yields in its third pass;
    TRL's own sampler, rebuilt, would replay its first pass's order."""
    def trl_sampler() -> RepeatSampler:
        return RepeatSampler(list(range(8)), mini_repeat_count=2, batch_size=4, seed=0)

    uninterrupted = EpochReplaySampler(trl_sampler())
    orders = []
    for epoch in range(3):
        uninterrupted.set_epoch(epoch)
        orders.append(list(uninterrupted))
    assert len({tuple(order) for order in orders}) == 3  # the order changes every epoch
    assert all(sorted(order) == sorted(list(range(8)) * 2) for order in orders)

    resumed = EpochReplaySampler(trl_sampler())
    resumed.set_epoch(2)
    assert list(resumed) == orders[2]
    assert list(trl_sampler()) == orders[0]


class _WalkthroughOrNot:
    """Rollouts whose outcome varies, so groups have successes and TASPO has PI: each sibling follows one of its
    game's `walkthrough_plans` (two win, two stall), drawn from torch's global RNG at the step's first turn, as
    sampling would draw its tokens; every log-probability is the policy's real one (`PlannedGenerator`)."""

    def __init__(self, trainer, walkthroughs: dict[str, list[str]]):
        self.trainer, self.walkthroughs, self.inner = trainer, walkthroughs, None

    def __call__(self, prompts: list[list[int]]):
        if self.inner is None:
            tokenizer = self.trainer.processing_class
            plans = []
            for prompt in prompts:
                text = tokenizer.decode(prompt)
                [walkthrough] = [w for task, w in self.walkthroughs.items() if task in text]
                options = walkthrough_plans(walkthrough, MAX_TURNS, wins=2)
                plans.append(options[int(torch.randint(len(options), ()))])
            self.inner = PlannedGenerator(self.trainer.model, tokenizer, plans)
        return self.inner(prompts)


class _RecordStep(TrainerCallback):
    """The task and the PI of every optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.steps = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        tasks = [t.task for t in self.trainer.last_step.trajectories]
        self.steps[state.global_step] = (tasks, list(self.trainer.last_step.privileged_info))


def test_resumed_run_matches_an_uninterrupted_one(tmp_path, games_dir, tiny_model_dir, monkeypatch):
    """Three TASPO steps straight through, against the same run resumed from its step-2 checkpoint (what a run
    stopped after step 2 leaves): step 3 trains on the same task with the same PI, and ends at the same weights.
    Two tasks and one task per step: step 3 opens the second epoch, whose order the sampler must redraw."""
    rows = task_spec_rows(sorted(games_dir.rglob("*.tw-pddl")))
    walkthroughs = {json.loads(r["prompt"])["task"]: json.loads(Path(r["game_file"]).read_text())["walkthrough"]
                    for r in rows}
    monkeypatch.setattr(grpo_module, "generator_for_trainer",
                        lambda trainer, batch_size=None: _WalkthroughOrNot(trainer, walkthroughs))

    def run(out: Path, resume: str | None) -> tuple:
        extra = ["--max_steps", "3", "--save_strategy", "steps", "--save_steps", "2", "--learning_rate", "1e-3",
                 "--max_turns", str(MAX_TURNS), "--max_completion_length", "48"]
        if resume:
            extra += ["--resume_from_checkpoint", resume]
        trainer = build_trainer(_argv("alfworld_taspo_cpu", out, games_dir, *extra), model_override=tiny_model_dir)
        recorder = _RecordStep(trainer)
        trainer.add_callback(recorder)
        try:
            trainer.train(resume_from_checkpoint=resume)
        finally:
            trainer.close()
        return recorder.steps, trainer.model.state_dict()

    straight, straight_weights = run(tmp_path / "straight", None)
    checkpoint = tmp_path / "straight" / "checkpoint-2"
    resumed, resumed_weights = run(tmp_path / "resumed", str(checkpoint))

    assert sorted(resumed) == [3]  # only step 3 ran after the resume
    assert {tuple(straight[s][0]) for s in (1, 2)} == {(t,) * 4 for t in walkthroughs}  # epoch 1: both tasks
    assert resumed[3] == straight[3]
    assert any(straight[3][1])  # step 3 has PI: the comparison is not between empty lists
    for name, tensor in straight_weights.items():
        assert torch.equal(resumed_weights[name], tensor), name


def test_reward_funcs_and_env_kwargs_from_the_command_line(tmp_path, games_dir, tiny_model_dir, monkeypatch):
    """As `trl grpo`: `--reward_funcs` takes a TRL reward by name and your own as module.function (imported from the
    working directory); they add to the environment's verified reward. `--env_kwargs` reaches every task spec."""
    (tmp_path / "my_rewards.py").write_text("def brevity(completions, num_turns, **kwargs):\n"
                                            "    return [-float(n) for n in num_turns]\n")
    monkeypatch.chdir(tmp_path)
    argv = _argv("alfworld_grpo_cpu", tmp_path / "out", games_dir, "--reward_funcs", "my_rewards.brevity",
                 "think_format_reward", "--env_kwargs", '{"max_turns": 1, "room": "kitchen"}')
    trainer = build_trainer(argv, model_override=tiny_model_dir)
    try:
        assert trainer.reward_func_names == ["brevity", "think_format_reward", "environment_reward"]
        specs = [grpo_module.task_spec_from_row(row) for row in trainer.train_dataset]
        assert {(spec["max_turns"], spec["room"]) for spec in specs} == {(1, "kitchen")}
    finally:
        trainer.close()
    for bad, problem in ((["--reward_funcs", "no_such_reward"], "is not in trl.rewards"),
                         (["--reward_funcs", "my_rewards.missing"], "has no attribute 'missing'"),
                         (["--env_kwargs", "[1, 2]"], "env_kwargs must be a mapping")):
        with pytest.raises(SystemExit) as stopped:
            train_main(_argv("alfworld_grpo_cpu", tmp_path / "bad", games_dir, "--model_name_or_path", tiny_model_dir,
                             *bad))
        assert problem in str(stopped.value) and "\n" not in str(stopped.value)


def test_help_starts_with_a_description_and_the_recipe_usage(capsys):
    with pytest.raises(SystemExit):
        train_main(["--help"])
    head = capsys.readouterr().out.splitlines()[:12]
    assert head[0] == "usage: taspo-train --config RECIPE [--setting value ...]"
    assert any("taspo-train --config alfworld_taspo_cpu" in line for line in head)
    assert any("--method NAME --help" in line for line in head)


def test_only_the_main_process_prints_the_run_lines(capsys, monkeypatch):
    from taspo_trl.cli import say

    monkeypatch.setenv("RANK", "1")
    say("precision: float32")
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    say("precision: float32")
    assert capsys.readouterr().out == "[taspo-train] precision: float32\n"
