"""TRL's environment API both ways: a TRL-style environment class in our trainers (through the batched agent loop),
and our environments (the real ALFWorld engine among them) in a plain ``trl.GRPOTrainer``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import llama3_1_chat_template, qwen2_5_chat_template

import taspo_trl.rollout.trl_rollout as trl_rollout
import taspo_trl.trainers.grpo as grpo_module
from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, TASPOConfig, TASPOTrainer, as_trl_environment
from taspo_trl.envs import encode_task_prompt, task_spec_from_row
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.envs.trl_style import (
    ToolCall,
    ToolCallError,
    TRLStyleEnvFactory,
    keep_prompt_column,
    parse_tool_call,
    tool_call_tag,
)
from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.env_pool import EnvPool
from taspo_trl.rollout.loop import run_agent_loop
from taspo_trl.rollout.trl_rollout import make_rollout_func
from taspo_trl.testing import PlannedGenerator
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.toy_envs import ScriptedGenerator, fault_factory, locker_factory

# ---- a small environment as a TRL user writes one ---------------------------------------------------------


class LockerRoom:
    """Five lockers, the key in one of them (the dataset's `key_locker` column)."""

    def __init__(self):
        self.key_locker = 0
        self.found = False
        self.done = False
        self.resets: list[dict] = []

    def reset(self, key_locker: int, **kwargs) -> str:
        self.resets.append({"key_locker": key_locker, **kwargs})
        self.key_locker, self.found, self.done = int(key_locker), False, False
        return "There are five lockers, numbered 1 to 5."

    def open_locker(self, number: int) -> str:
        """Opens a locker and looks inside.

        Args:
            number: The locker to open, from 1 to 5.

        Returns:
            What is inside.
        """
        if not 1 <= number <= 5:
            raise ValueError(f"There is no locker {number}.")
        if number == self.key_locker:
            self.found = self.done = True
            return "You found the key!"
        return "The locker is empty."

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0


class Calculator:
    """No get_reward: its reward comes from reward functions, as in TRL."""

    def reset(self, **kwargs) -> None:
        return None

    def add(self, a: int, b: int) -> int:
        """Adds two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b


class Undocumented:
    def reset(self, **kwargs) -> None:
        return None

    def poke(self, x):
        return x


LOCKER_TOOLS = {"open_locker": LockerRoom().open_locker}


@pytest.fixture(scope="module")
def qwen_template_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with a tool-calling chat template (TRL's copy of Qwen2.5's) on the embedded tokenizer."""
    out = tmp_path_factory.mktemp("qwen_template")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(out)
    for path in Path(tiny_model_dir).iterdir():
        if not (out / path.name).exists():
            (out / path.name).symlink_to(path)
    return str(out)


@pytest.fixture(scope="module")
def pick_game(tmp_path_factory):
    games = generate_games(tmp_path_factory.mktemp("games"), per_type=1, seed=0, split="train", task_types=["pick_and_place_simple"])
    return games[0]


def _walkthrough(game) -> list[str]:
    return json.loads(Path(game).read_text())["walkthrough"]


def _trl_rows(game) -> list[dict]:
    """TRL-style rows of a game: a plain-text prompt, the task data in columns."""
    spec = json.loads(task_spec_rows([game])[0]["prompt"])
    return [{"prompt": spec["task"], "game_file": spec["game_file"], "task_type": spec["task_type"]}]


def _specs(rows: list[dict], copies: int) -> list[dict]:
    """The task specs the trainer builds from `rows` (prompt kept, as the trainer's dataset does)."""
    kept = keep_prompt_column(Dataset.from_list(rows))
    return [task_spec_from_row(dict(kept[i])) for i in range(len(rows)) for _ in range(copies)]


# ---- parsing the model's calls ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=-(10**6), max_value=10**6))
def test_call_syntaxes_agree(number):
    expected = {"number": number}
    assert parse_tool_call(f"open_locker(number={number})", LOCKER_TOOLS) == ToolCall("open_locker", (), expected)
    as_json = json.dumps({"name": "open_locker", "arguments": {"number": number}})
    assert parse_tool_call(as_json, LOCKER_TOOLS) == ToolCall("open_locker", (), expected)
    # Arguments written as a JSON string, as some models do.
    as_string = json.dumps({"name": "open_locker", "arguments": json.dumps(expected)})
    assert parse_tool_call(as_string, LOCKER_TOOLS) == ToolCall("open_locker", (), expected)
    assert parse_tool_call(f" open_locker({number}) ", LOCKER_TOOLS) == ToolCall("open_locker", (number,), {})


@pytest.mark.parametrize(
    "text,message",
    [
        ("open_lockr(number=2)", "Unknown tool 'open_lockr'. The tools are: open_locker."),
        ("open_locker(2, door=3)", "open_locker: got an unexpected keyword argument 'door'. Its signature is"),
        ("open_locker()", "missing a required argument: 'number'"),
        ("open_locker(number=x + 1)", "literal values"),
        ("open the second locker", "name(argument=value"),
        ('{"name": "open_locker", "arguments": {', "not valid JSON"),
        ('{"tool": "open_locker"}', '{"name": <tool name>'),
    ],
)
def test_malformed_calls_explain_themselves(text, message):
    with pytest.raises(ToolCallError, match=re.escape(message)):
        parse_tool_call(text, LOCKER_TOOLS)


def test_a_single_text_tool_takes_plain_commands():
    act = as_trl_environment(locker_factory)().act
    assert parse_tool_call("open locker 2", {"act": act}) == ToolCall("act", ("open locker 2",), {})
    assert parse_tool_call("look", {"act": act}) == ToolCall("act", ("look",), {})
    assert parse_tool_call('act(action="look")', {"act": act}) == ToolCall("act", (), {"action": "look"})


def test_the_call_format_follows_the_chat_template(embedded_tokenizer):
    assert tool_call_tag(embedded_tokenizer) == "action"  # SmolLM2's ChatML template has no tool calls
    qwen = AutoTokenizer.from_pretrained(embedded_tokenizer.name_or_path)
    qwen.chat_template = qwen2_5_chat_template
    assert tool_call_tag(qwen) == "tool_call"
    llama = AutoTokenizer.from_pretrained(embedded_tokenizer.name_or_path)
    llama.chat_template = llama3_1_chat_template  # calls tools, but as bare JSON: our <action> format instead
    assert tool_call_tag(llama) == "action"


# ---- a TRL-style environment in the batched agent loop ------------------------------------------------------


def test_trl_style_environment_plays_in_our_loop_in_the_action_format(embedded_tokenizer):
    factory = TRLStyleEnvFactory(LockerRoom)
    rows = [{"prompt": "Find the key.", "key_locker": 2}]
    responses = [
        "<action>open_locker(number=7)</action>",  # the tool raises: TRL's error answer, the episode goes on
        "<action>open_lockr(2)</action>",  # unknown tool: feedback
        "<action>open_locker(number=2)</action>",
    ]
    trajectory = run_agent_loop(
        _specs(rows, 1), EnvPool(factory), ScriptedGenerator(embedded_tokenizer, responses), ChatFormat(embedded_tokenizer)
    )[0]
    assert [turn.observation for turn in trajectory.turns] == [
        "Error: There is no locker 7.",
        "Invalid tool call: Unknown tool 'open_lockr'. The tools are: open_locker.",
        "You found the key!",
    ]
    assert (trajectory.reward, trajectory.won, trajectory.truncated) == (1.0, True, False)
    assert trajectory.task == "Find the key." and trajectory.initial_observation.startswith("There are five lockers")
    prompt = trajectory.turns[0].prompt_text
    assert "- open_locker(number: integer): Opens a locker and looks inside." in prompt  # tools listed for <action>


def test_reset_receives_the_row_columns_and_json_task_specs(embedded_tokenizer):
    rows = [
        {"prompt": "Find the key.", "key_locker": 4, "task_type": "lockers"},
        {"prompt": encode_task_prompt({"key_locker": 5})},  # a row of the existing JSON-in-prompt kind
    ]
    envs = [TRLStyleEnvFactory(LockerRoom)(_specs([row], 1)[0]) for row in rows]  # one dataset each: no None-filled columns
    for env in envs:
        env.reset()
    assert envs[0].instance.resets == [{"key_locker": 4, "task_type": "lockers", "prompt": "Find the key."}]
    assert envs[1].instance.resets == [{"key_locker": 5, "prompt": encode_task_prompt({"key_locker": 5})}]
    assert envs[0].task_type == "lockers"


def test_a_reply_without_a_call_ends_the_episode_in_the_tool_call_format(qwen_template_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen_template_model_dir)
    factory = TRLStyleEnvFactory(LockerRoom)
    factory.action_tag = tool_call_tag(tokenizer)
    chat = ChatFormat(tokenizer, tools=factory.tool_schemas)
    call = '<tool_call>\n{"name": "open_locker", "arguments": {"number": 1}}\n</tool_call>'
    generator = ScriptedGenerator(tokenizer, [call, "The key is not in locker 1."])
    trajectory = run_agent_loop(_specs([{"prompt": "Find the key.", "key_locker": 3}], 1), EnvPool(factory), generator, chat)[0]
    assert [turn.observation for turn in trajectory.turns] == ["The locker is empty.", ""]
    assert (trajectory.num_turns, trajectory.reward, trajectory.won, trajectory.truncated) == (2, 0.0, False, False)
    assert [turn.action for turn in trajectory.turns] == ['{"name": "open_locker", "arguments": {"number": 1}}', ""]
    # The chat template rendered the tool schema into the prompt.
    prompt = tokenizer.decode(trajectory.turns[0].prompt_ids)
    assert "<tools>" in prompt and '"name": "open_locker"' in prompt


# ---- our trainers with environment_factory -------------------------------------------------------------------


class ToolCallPlans(PlannedGenerator):
    """Planned calls written in the Qwen template's tool-call format."""

    def response_text(self, action):
        return "I give up." if action is None else f'<tool_call>\n{{"name": "open_locker", "arguments": {{"number": {action}}}}}\n</tool_call>'


def test_agent_grpo_trains_on_a_trl_style_environment_with_tool_calls(tmp_path, qwen_template_model_dir, monkeypatch):
    args = AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path, max_turns=3))
    dataset = Dataset.from_list([{"prompt": "Find the key.", "key_locker": 2}])
    trainer = AgentGRPOTrainer(model=qwen_template_model_dir, args=args, train_dataset=dataset, environment_factory=LockerRoom)
    assert trainer.environments is None and not trainer.tools  # TRL's own tool loop is not set up
    assert trainer.reward_func_names == ["LockerRoom"]  # get_reward's column, named as TRL names it
    plans = [[1, 2], [2], [3, 4, 5], [None]]
    fresh = lambda _trainer, batch_size=None: ToolCallPlans(trainer.model, trainer.processing_class, plans)  # noqa: E731
    monkeypatch.setattr(grpo_module, "generator_for_trainer", fresh)
    row = dict(trainer.train_dataset[0])
    batch = trainer._generate_and_score_completions([dict(row) for _ in range(4)])
    won = [t.won for t in trainer.last_step.trajectories]
    assert won == [True, True, False, False]
    # Rewards 1, 1, 0, 0: mean 0.5, sample std sqrt(1/3), so a winner's tokens get A = 0.5 / (sqrt(1/3) + delta).
    first_turn = batch["advantages"][0][batch["tool_mask"][0] > 0]
    assert torch.allclose(first_turn, torch.full_like(first_turn, 0.5 / ((1 / 3) ** 0.5 + 1e-4)), atol=1e-6)
    trainer.train()  # one whole optimizer step through TRL's loop
    assert trainer.state.global_step == 1


def test_taspo_trains_on_alfworld_as_a_trl_style_environment(tmp_path, tiny_model_dir, pick_game, monkeypatch):
    """The round trip: ALFWorld exposed with TRL's API, then trained on with TASPO through our loop."""
    walkthrough = _walkthrough(pick_game)
    args = TASPOConfig(**cpu_trainer_kwargs(tmp_path, max_turns=len(walkthrough) + 1))
    trainer = TASPOTrainer(
        model=tiny_model_dir, args=args, train_dataset=Dataset.from_list(_trl_rows(pick_game)),
        environment_factory=as_trl_environment("alfworld"),
    )
    plans = [list(walkthrough), walkthrough[:1] + ["look"] + walkthrough[1:], ["look"] * (len(walkthrough) + 1), [None]]
    generator = PlannedGenerator(trainer.model, trainer.processing_class, plans)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    trainer.train()
    trajectories = trainer.last_step.trajectories
    assert [t.won for t in trajectories] == [True, True, False, False]
    assert trajectories[0].task == _trl_rows(pick_game)[0]["prompt"]
    logged = trainer.state.log_history[0]
    assert logged["pi/coverage"] > 0  # privileged guidance from the winning siblings reached the failures
    assert logged["taspo/weight_std"] > 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"rollout_func": lambda prompts, trainer: {}}, "rollout_func is not used by the agent trainers"),
        ({"tools": [print]}, "tools= is not used"),
        ({"environment_factory": LockerRoom, "env_factory": locker_factory}, "either env_factory= .* or environment_factory="),
        ({"environment_factory": {"a": LockerRoom}}, "as a dict"),
        ({"environment_factory": Calculator}, "No reward source: Calculator has no get_reward"),
        ({"environment_factory": Undocumented, "reward_funcs": [len]}, "Undocumented.poke cannot be described as a tool"),
        ({"environment_factory": LockerRoom, "train_dataset": None}, "need a train_dataset"),
    ],
)
def test_arguments_the_trainer_would_ignore_are_refused(tmp_path, kwargs, message):
    kwargs = {"train_dataset": Dataset.from_list([{"prompt": "p", "key_locker": 1}]), **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        AgentGRPOTrainer(model="unused-never-loaded", args=AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path)), **kwargs)


def test_trl_tool_loop_settings_are_refused_with_environment_factory(tmp_path):
    args = AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path, max_tool_calling_iterations=4))
    with pytest.raises(ValueError, match="set max_turns"):
        AgentGRPOTrainer(model="unused", args=args, train_dataset=Dataset.from_list([{"prompt": "p"}]), environment_factory=LockerRoom)


# ---- our environments in TRL ----------------------------------------------------------------------------------


def test_our_environment_has_trls_api():
    environment = as_trl_environment(locker_factory)()
    opening = environment.reset(prompt="Find the key.", target=2)
    assert opening.startswith("Your task is: find the key in one of the lockers\nObservation: You are in a locker room.")
    assert "Admissible actions: open locker 1, open locker 2" in opening
    assert environment.act("open locker 1").startswith("The locker is empty.")
    assert environment.get_reward() == 0.0 and not environment.done
    assert environment.act("open locker 2") == "You find the key!\nThe episode is over."
    assert (environment.get_reward(), environment.won, environment.done) == (1.0, True, True)
    with pytest.raises(ValueError, match="episode is over"):
        environment.act("open locker 3")
    environment.reset(prompt=encode_task_prompt({"target": 5}))  # a JSON task spec in the prompt
    assert environment.act("open locker 5").startswith("You find the key!")


def test_alfworld_through_trls_api_wins_with_its_walkthrough(pick_game):
    environment = as_trl_environment("alfworld")()
    row = _trl_rows(pick_game)[0]
    assert environment.reset(**row).startswith(f"Your task is: {row['prompt']}")
    answers = [environment.act(command) for command in _walkthrough(pick_game)]
    assert answers[-1].endswith("The episode is over.")
    assert (environment.get_reward(), environment.won) == (1.0, True)


def test_plain_trl_grpo_trainer_runs_alfworld_as_its_environment(tmp_path, qwen_template_model_dir, pick_game, monkeypatch):
    """TRL's own tool loop drives ALFWorld; the model is scripted (a random tiny model does not call tools), the
    parsing, tool execution, reward and training step are TRL's."""
    walkthrough = _walkthrough(pick_game)
    row = _trl_rows(pick_game)[0]
    dataset = Dataset.from_list([{**row, "prompt": [{"role": "user", "content": row["prompt"]}]}])
    args = GRPOConfig(**cpu_trainer_kwargs(tmp_path, per_device_train_batch_size=2, num_generations=2, max_completion_length=256))
    trainer = GRPOTrainer(model=qwen_template_model_dir, args=args, train_dataset=dataset,
                          environment_factory=as_trl_environment("alfworld"))
    tokenizer = trainer.processing_class
    replies = [f'<tool_call>\n{{"name": "act", "arguments": {{"action": "{walkthrough[0]}"}}}}\n</tool_call>', "Done."]
    calls = []

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        text = replies[min(len(calls), len(replies) - 1)]
        calls.append(len(prompt_ids))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return [list(ids) for _ in prompt_ids], None

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted)
    trainer.train()
    assert calls == [2, 2]  # one tool round for both rollouts, then the final answers
    environments = trainer.environments
    assert [env.turns for env in environments] == [1, 1]  # act ran once in each rollout
    assert trainer.state.log_history[0]["rewards/TRLEnvironment/mean"] == 0.0  # one step does not win the game
    assert trainer.state.log_history[0]["tools/call_frequency"] > 0


# ---- make_rollout_func ----------------------------------------------------------------------------------------


def test_make_rollout_func_plays_rows_for_plain_trl(tmp_path, tiny_model_dir, monkeypatch):
    rollout = make_rollout_func(locker_factory, max_turns=2)
    args = GRPOConfig(**cpu_trainer_kwargs(tmp_path, per_device_train_batch_size=2, num_generations=2, max_completion_length=16))
    prompts = [encode_task_prompt({"target": 2})] * 2
    trainer = GRPOTrainer(model=tiny_model_dir, args=args, train_dataset=Dataset.from_list([{"prompt": prompts[0]}]),
                          reward_funcs=[grpo_module.environment_reward], rollout_func=rollout)
    generator = ScriptedGenerator(trainer.processing_class, ["<action>open locker 1</action>", "<action>open locker 2</action>"])
    monkeypatch.setattr(trl_rollout, "generator_for_trainer", lambda _trainer: generator)
    out = rollout(prompts, trainer)
    assert out["env_reward"] == [1.0, 1.0] and out["won"] == [True, True] and out["num_turns"] == [2, 2]
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["env_mask"]) == 2
    # One row per trajectory: the two responses are policy tokens (1), the observation between them is not (0).
    mask = out["env_mask"][0]
    assert mask[0] == 1 and mask[-1] == 1 and 0 in mask
    assert [len(m) for m in out["env_mask"]] == [len(c) for c in out["completion_ids"]]
    assert len(out["logprobs"][0]) == len(out["completion_ids"][0])


def test_make_rollout_func_gives_its_pool_the_step_timeout(monkeypatch):
    made = {}

    class RecordingPool(EnvPool):
        def __init__(self, factory, **kwargs):
            made.update(kwargs)
            super().__init__(factory, **kwargs)

    monkeypatch.setattr(trl_rollout, "EnvPool", RecordingPool)
    make_rollout_func(locker_factory, env_step_timeout=7.5)
    assert made == {"num_workers": 0, "step_timeout": 7.5}


@pytest.mark.slow  # spawns environment worker processes (the fast test above checks the wiring)
def test_make_rollout_func_ends_a_hanging_step_at_the_timeout(tmp_path, tiny_model_dir, monkeypatch):
    rollout = make_rollout_func(fault_factory, max_turns=2, env_workers=2, env_step_timeout=2.0)
    trainer = GRPOTrainer(
        model=tiny_model_dir, args=GRPOConfig(**cpu_trainer_kwargs(tmp_path, per_device_train_batch_size=2, num_generations=2)),
        train_dataset=Dataset.from_list([{"prompt": "p"}]), reward_funcs=[grpo_module.environment_reward], rollout_func=rollout,
    )
    generator = ScriptedGenerator(trainer.processing_class, ["<action>win</action>"])
    monkeypatch.setattr(trl_rollout, "generator_for_trainer", lambda _trainer: generator)
    out = rollout([encode_task_prompt({"fault": "hang"}), encode_task_prompt({"fault": None})], trainer)
    # The hanging step ends its episode with an environment error; the other worker's episode wins.
    assert out["env_reward"] == [0.0, 1.0] and out["won"] == [False, True] and out["num_turns"] == [1, 1]
