"""Small deterministic environments for testing the agent loop's mechanics (the real ALFWorld engine is
exercised in the ALFWorld tests and the end-to-end runs), and ``FaultEnv``, whose step or reset fails on demand
for the environment-worker fault tests (worker processes import ``fault_factory`` from here by module path)."""

from __future__ import annotations

import os
import signal
import threading
import time

from taspo_trl.envs.base import StepResult


class LockerEnv:
    """Five lockers, one holds the key: open the right one to win. Unknown commands: 'Nothing happens.'"""

    action_tag = "action"
    env_name = "lockers"

    def __init__(self, target: int = 3, max_turns: int = 4, crash_on: str | None = None, fail_reset: bool = False):
        self.target = target
        self.max_turns = max_turns
        self.crash_on = crash_on
        self.fail_reset = fail_reset
        self.steps = 0

    @property
    def task(self) -> str:
        return "find the key in one of the lockers"

    @property
    def admissible_commands(self) -> list[str]:
        return [f"open locker {n}" for n in range(1, 6)]

    def reset(self) -> str:
        if self.fail_reset:
            raise RuntimeError("simulated failure at reset")
        self.steps = 0
        return "You are in a locker room. There are 5 lockers."

    def step(self, action: str) -> StepResult:
        if self.crash_on is not None and action == self.crash_on:
            raise RuntimeError("simulated environment crash")
        self.steps += 1
        if action == f"open locker {self.target}":
            return StepResult("You find the key!", 1.0, True, {"won": True, "admissible_commands": []})
        text = "The locker is empty." if action in self.admissible_commands else "Nothing happens."
        return StepResult(text, 0.0, False, {"won": False, "admissible_commands": self.admissible_commands})

    def close(self) -> None:
        pass


def locker_factory(spec: dict) -> LockerEnv:
    return LockerEnv(int(spec.get("target", 3)), int(spec.get("max_turns", 4)), spec.get("crash_on"), bool(spec.get("fail_reset")))


class ScriptedGenerator:
    """Answers every prompt with the next scripted response text (tokenized), for loop-mechanics tests."""

    def __init__(self, tokenizer, responses: list[str]):
        self.tokenizer = tokenizer
        self.responses = responses
        self.calls: list[int] = []

    def __call__(self, prompts):
        from taspo_trl.rollout.generation import Generation

        self.calls.append(len(prompts))
        out = []
        for _ in prompts:
            text = self.responses[min(len(self.calls) - 1, len(self.responses) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-1.0] * len(ids), True))
        return out



class QuizEnv:
    """Two action kinds, like Search-QA: ``<look>topic</look>`` reveals a hint, ``<answer>x</answer>`` ends the
    episode. ``step_many`` records how many episodes each batched call stepped."""

    action_tags = ("look", "answer")
    action_tag = "answer"
    env_name = "quiz"
    instructions = "Look things up with <look> topic </look>."
    admissible_commands = None
    batch_sizes: list[int] = []

    def __init__(self, max_turns: int = 3):
        self.max_turns = max_turns
        self.received: list[str] = []

    @property
    def task(self) -> str:
        return "name the capital of the quiz country"

    def reset(self) -> str:
        return "Ask or answer."

    def step(self, action: str) -> StepResult:
        self.received.append(action)
        if action.startswith("<answer>"):
            won = action == "<answer>Quizville</answer>"
            return StepResult("Done.", float(won), True, {"won": won})
        if action.startswith("<look>"):
            return StepResult("The capital is Quizville.", 0.0, False, {"won": False})
        return StepResult("Use <look> or <answer>.", 0.0, False, {"won": False})

    @staticmethod
    def step_many(envs: list["QuizEnv"], actions: list[str]) -> list[StepResult]:
        QuizEnv.batch_sizes.append(len(envs))
        return [env.step(action) for env, action in zip(envs, actions, strict=True)]

    def close(self) -> None:
        pass


def quiz_factory(spec: dict) -> QuizEnv:
    return QuizEnv(int(spec.get("max_turns", 3)))


class FaultEnv:
    """One step to a win, unless the spec names a fault: ``hang``/``raise``/``unpicklable``/``die`` at ``step``
    (or ``hang`` at ``reset``)."""

    def __init__(self, fault: str | None, at: str):
        self.fault = fault
        self.at = at
        self.task = "win"
        self.admissible_commands = ["win"]

    def _maybe_fail(self, phase: str) -> dict:
        if self.at != phase or self.fault is None:
            return {}
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "raise":
            raise RuntimeError("simulated environment crash")
        if self.fault == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"lock": threading.Lock()}  # "unpicklable"

    def reset(self) -> str:
        self._maybe_fail("reset")
        return "ready"

    def step(self, action: str) -> StepResult:
        extra = self._maybe_fail("step")
        return StepResult("you win", 1.0, True, {"won": True, **extra})


def fault_factory(spec: dict) -> FaultEnv:
    return FaultEnv(spec.get("fault"), spec.get("at", "step"))
