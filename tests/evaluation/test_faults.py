"""``taspo-eval`` under faults and with TRL's generation keys: a hanging environment ends its episode, never the
evaluation; ``GRPOConfig``'s sampling settings reach the sampler."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from taspo_trl.envs.base import StepResult, encode_task_prompt
from taspo_trl.evaluation import EvalArguments, _parse_eval_args, evaluate_rows, transformers_generator
from taspo_trl.models import load_model_and_tokenizer
from tests.helpers.toy_envs import LockerEnv, ScriptedGenerator

GOOD = "<think>The key is in locker 3.</think> <action>open locker 3</action>"
_RELEASE = threading.Event()  # lets the threads left hanging end when the test module is done


class HangingLocker(LockerEnv):
    """A locker room whose ``hang_at`` call ("reset" or "step") blocks, as a stuck simulator or socket would."""

    def __init__(self, hang_at: str | None) -> None:
        super().__init__(target=3)
        self.hang_at = hang_at

    def reset(self) -> str:
        if self.hang_at == "reset":
            _RELEASE.wait()
        return super().reset()

    def step(self, action: str) -> StepResult:
        if self.hang_at == "step":
            _RELEASE.wait()
        return super().step(action)


def hanging_factory(spec: dict) -> HangingLocker:
    return HangingLocker(spec.get("hang_at"))


def sleeping_factory(spec: dict) -> LockerEnv:
    """For worker processes (a module-level, picklable factory): the step of a ``hang`` task never returns."""
    env = LockerEnv(target=3)
    if spec.get("hang"):
        env.step = lambda action: time.sleep(3600)  # type: ignore[method-assign]
    return env


@pytest.fixture(scope="module", autouse=True)
def release_hung_threads() -> Iterator[None]:
    yield
    _RELEASE.set()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_and_tokenizer(tiny_model_dir)


def _rows(*specs: dict) -> list[dict]:
    return [{"prompt": encode_task_prompt(spec), "task_type": "lockers"} for spec in specs]


@pytest.mark.parametrize("hang_at", ["reset", "step"])
def test_a_hanging_environment_fails_its_episode_and_the_evaluation_goes_on(tiny, hang_at, caplog):
    _, tokenizer = tiny
    args = EvalArguments(env_step_timeout=0.5, max_turns=3, eval_batch_size=3)
    rows = _rows({"hang_at": None}, {"hang_at": hang_at}, {"hang_at": None})
    with caplog.at_level(logging.WARNING):
        trajectories = evaluate_rows(rows, None, tokenizer, args, hanging_factory,
                                     generate=ScriptedGenerator(tokenizer, [GOOD]))
    assert [t.won for t in trajectories] == [True, False, True]
    assert trajectories[1].error is not None and "env_step_timeout" in trajectories[1].error
    assert trajectories[0].error is None and trajectories[2].error is None
    assert "did not return within 0.5 s" in caplog.text


@pytest.mark.slow
def test_a_hanging_step_in_a_worker_fails_its_episode(tiny):
    _, tokenizer = tiny
    args = EvalArguments(env_step_timeout=2.0, max_turns=3, eval_batch_size=2, num_env_workers=1)
    trajectories = evaluate_rows(_rows({"hang": False}, {"hang": True}), None, tokenizer, args, sleeping_factory,
                                 generate=ScriptedGenerator(tokenizer, [GOOD]))
    # One worker holds both episodes: when it is replaced, both end with the environment error.
    assert [t.won for t in trajectories] == [False, False]
    assert all("did not answer" in (t.error or "") for t in trajectories)


def test_the_environment_keeps_its_name_and_attributes_under_the_deadline(tiny):
    _, tokenizer = tiny
    trajectories = evaluate_rows(_rows({"hang_at": None}), None, tokenizer, EvalArguments(max_turns=2),
                                 hanging_factory, generate=ScriptedGenerator(tokenizer, [GOOD]))
    assert trajectories[0].env_name == "lockers" and trajectories[0].task == LockerEnv().task


def test_generation_keys_reach_the_transformers_sampler(tiny):
    model, tokenizer = tiny
    args = EvalArguments(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, repetition_penalty=1.3,
                         generation_kwargs={"no_repeat_ngram_size": 2, "min_p": 0.1})
    generator = transformers_generator(model, tokenizer, args)
    assert (generator.temperature, generator.top_p, generator.top_k) == (0.7, 0.9, 5)
    # generation_kwargs win over the named settings, as in TRL
    assert generator.generation_kwargs == {"min_p": 0.1, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2}


def test_a_generation_kwarg_changes_what_is_generated(tiny):
    model, tokenizer = tiny
    prompt = [tokenizer("the key is in the locker", add_special_tokens=False)["input_ids"]]
    plain = transformers_generator(model, tokenizer, EvalArguments(temperature=0, max_completion_length=40))
    distinct = transformers_generator(model, tokenizer, EvalArguments(
        temperature=0, max_completion_length=40, generation_kwargs={"no_repeat_ngram_size": 1}))
    free, constrained = plain(prompt)[0].token_ids, distinct(prompt)[0].token_ids
    assert len(set(free)) < len(free)  # greedy decoding of a random model repeats itself
    assert len(set(constrained)) == len(constrained)  # no_repeat_ngram_size=1: no token twice


def test_a_recipe_s_generation_keys_carry_over_to_the_evaluation(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "environment: search\nlearning_rate: 1.0e-6\ntemperature: 0.8\ntop_k: 7\nmin_p: 0.02\n"
        "repetition_penalty: 1.1\ngeneration_kwargs:\n  no_repeat_ngram_size: 3\nuse_vllm: true\n"
    )
    args, _ = _parse_eval_args(["--config", str(recipe), "--top_k", "9"])
    assert (args.temperature, args.top_k, args.min_p, args.repetition_penalty) == (0.8, 9, 0.02, 1.1)
    assert args.generation_kwargs == {"no_repeat_ngram_size": 3} and args.use_vllm is True


def test_generation_kwargs_from_the_command_line_are_json():
    args, _ = _parse_eval_args(["--generation_kwargs", '{"no_repeat_ngram_size": 2}'])
    assert args.generation_kwargs == {"no_repeat_ngram_size": 2}
