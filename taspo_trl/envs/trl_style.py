"""TRL's environment API (``GRPOTrainer(environment_factory=...)``), both ways.

**A TRL-style environment in our trainers.** TRL's environment is a class built with no arguments whose
``reset(**row)`` starts an episode from a dataset row's columns (the ``prompt`` among them) and may return text
shown after the prompt, whose public methods are the tools the model calls (type hints and a Google-style
docstring, as for TRL's ``tools``), and whose optional ``get_reward()`` scores the episode.
``TRLStyleEnvFactory`` wraps such a class into our environment protocol, so it runs through the batched agent
loop and every trainer here works on it unchanged:

- one instance per rollout; a turn is one tool call, its result (``str`` of the return value) is the next
  observation; a call that raises answers ``Error: <message>``, like TRL, and the episode goes on;
- a malformed call (unknown tool, unparsable text, arguments that do not fit the signature) answers with what
  was wrong and the episode goes on; a response without any call ends the episode, as in TRL, where a reply
  without a tool call is the final answer;
- the episode also ends when the instance's ``done`` attribute turns true, or at the turn limit (the
  instance's ``max_turns`` attribute, else ``DEFAULT_MAX_TURNS``, capped by the trainer's ``max_turns``);
- ``get_reward()`` (sync or async) is the trajectory's reward; it is read after every turn, because the loop
  may end an episode at any turn, so keep it cheap. The episode counts as won (what TASPO and AlignOPSD learn
  from) when the instance's ``won`` attribute is true or, without one, when the reward is above 0.

The model calls tools in its chat template's own format when that template writes calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes-style templates;
the tool schemas are then rendered into the prompt by the template). Otherwise it calls them in our
``<action>`` block with Python call syntax and literal arguments, ``<action>open_locker(number=2)</action>``
(``<action>look</action>`` for a tool without arguments), and the prompt lists the tools. Both blocks also
accept the other syntax (a JSON object or a call).

**Our environments in TRL.** ``as_trl_environment("alfworld")`` (or any ``EnvFactory``) returns a factory for
``trl.GRPOTrainer(environment_factory=...)``: ``reset(**row)`` builds the episode from the row (columns, or
the JSON task spec in ``prompt``) and returns the task and first observation; the one tool ``act(action)``
steps it; ``get_reward()`` is the environment's reward.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from .base import EnvFactory, StepResult, task_spec_from_row

TOOL_CALL_TAG = "tool_call"
"""The block tool-calling chat templates write calls in (``<tool_call>{...}</tool_call>``)."""
ACTION_TAG = "action"
DEFAULT_MAX_TURNS = 10
PROMPT_COLUMN = "_trl_prompt"
"""Where the trainer keeps a row's original ``prompt``: the agent loop's task specs leave ``prompt`` out, but TRL's
``reset(**row)`` receives it."""
_NOT_RESET_KWARGS = (PROMPT_COLUMN, "guidance")  # added by this package, not dataset columns


class ToolCallError(ValueError):
    """A tool call that cannot be made; its message is shown to the model."""


@dataclass
class ToolCall:
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def environment_tools(environment_class: type) -> dict[str, Callable]:
    """The tools of a TRL-style environment class, by name: its public functions other than ``reset`` and
    ``get_reward`` (what TRL exposes; listed on the class so that properties are not evaluated)."""
    return {
        name: member
        for name, member in inspect.getmembers(environment_class, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }


def parse_tool_call(text: str, tools: Mapping[str, Callable]) -> ToolCall:
    """The call of one of ``tools`` (bound methods, by name) written in ``text``: a JSON object
    ``{"name": ..., "arguments": {...}}`` or Python call syntax with literal arguments (``open_locker(number=2)``,
    ``open_locker(2)``, ``look``), checked against the tool's signature. When the environment has a single tool
    taking one ``str``, text that is no call of it is that argument (``go to desk 1`` for ``act(action)``), so
    plain commands work. Raises ``ToolCallError`` with a message for the model."""
    try:
        return _checked_call(text.strip(), tools)
    except ToolCallError:
        only = _single_text_tool(tools)
        if only is None or not text.strip():
            raise
        return ToolCall(only, (text.strip(),), {})


def _checked_call(text: str, tools: Mapping[str, Callable]) -> ToolCall:
    name, args, kwargs = _json_call(text) if text.startswith("{") else _python_call(text)
    if name not in tools:
        raise ToolCallError(f"Unknown tool {name!r}. The tools are: {', '.join(sorted(tools))}.")
    try:
        inspect.signature(tools[name]).bind(*args, **kwargs)
    except TypeError as exc:
        raise ToolCallError(f"{name}: {exc}. Its signature is {name}{inspect.signature(tools[name])}.") from None
    return ToolCall(name, args, kwargs)


def _single_text_tool(tools: Mapping[str, Callable]) -> str | None:
    if len(tools) != 1:
        return None
    name, tool = next(iter(tools.items()))
    params = list(inspect.signature(tool).parameters.values())
    return name if len(params) == 1 and params[0].annotation in (str, "str") else None


def _json_call(text: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    try:
        call = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"The tool call is not valid JSON ({exc.msg}).") from None
    arguments = call.get("arguments", call.get("parameters", {})) if isinstance(call, dict) else None
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
        raise ToolCallError('A tool call is a JSON object {"name": <tool name>, "arguments": {<name>: <value>}}.')
    return call["name"], (), arguments


def _python_call(text: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    usage = "Write a tool call as name(argument=value, ...) with literal values, e.g. open_locker(number=2)."
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ToolCallError(usage) from None
    if isinstance(node, ast.Name):
        return node.id, (), {}
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or any(k.arg is None for k in node.keywords):
        raise ToolCallError(usage)
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
        raise ToolCallError(usage) from None
    return node.func.id, args, kwargs


def _resolved(value: Any) -> Any:
    """``value``, awaited when an async method returned a coroutine."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _text(value: Any) -> str:
    """``reset``'s return value as text: None is nothing; TRL's multimodal content lists keep their text parts."""
    if value is None:
        return ""
    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "text")
    return str(value)


def _prompt_text(prompt: Any) -> str:
    """The task statement in a row's prompt: its last message's text, or "" when the prompt is a JSON task spec
    (rows built with ``encode_task_prompt``) or absent."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content", "")
    if not isinstance(prompt, str):
        return ""
    try:
        return "" if isinstance(json.loads(prompt), dict) else prompt
    except json.JSONDecodeError:
        return prompt


def tool_call_tag(tokenizer: Any) -> str:
    """``"tool_call"`` when the tokenizer's chat template writes an assistant's tool call as a JSON object inside
    ``<tool_call>`` ... ``</tool_call>`` (the format the agent loop can parse and locate), else ``"action"``."""
    call = {"type": "function", "function": {"name": "probe_tool_x", "arguments": {"probe_arg": 1}}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # templates without tool support raise all kinds of errors on tool_calls
        return ACTION_TAG
    block = re.search(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", rendered, re.DOTALL)
    try:
        return TOOL_CALL_TAG if block and json.loads(block.group(1)).get("name") == "probe_tool_x" else ACTION_TAG
    except json.JSONDecodeError:
        return ACTION_TAG


class TRLStyleEnvFactory:
    """Our ``EnvFactory`` for a TRL-style ``environment_factory`` (see the module docstring).

    Built once by the trainer: it makes one instance to check ``reset`` and read the tools, as TRL does. It is
    picklable when ``environment_factory`` is (a module-level class or function), for ``env_workers > 0``.
    ``action_tag`` is ``"action"`` until the trainer sets it from the chat template (``tool_call_tag``).
    """

    def __init__(self, environment_factory: Callable[[], Any]):
        if isinstance(environment_factory, Mapping):
            raise TypeError(
                "environment_factory as a dict (several environments routed by an `environment` column) is not "
                "supported by the agent trainers: pass one environment class, and route inside its reset(**row)."
            )
        if not callable(environment_factory):
            raise TypeError(f"environment_factory must be a class or a callable, got {environment_factory!r}.")
        probe = environment_factory()
        environment_class = type(probe)
        if not callable(getattr(probe, "reset", None)):
            raise TypeError(f"{environment_class.__name__} has no reset(**row) method; TRL-style environments need one.")
        tools = environment_tools(environment_class)
        if not tools:
            raise TypeError(f"{environment_class.__name__} has no public method for the model to call as a tool.")
        from transformers.utils import get_json_schema

        schemas = []
        for name, method in tools.items():
            try:
                schemas.append(get_json_schema(method))
            except Exception as exc:
                raise TypeError(
                    f"{environment_class.__name__}.{name} cannot be described as a tool ({exc}). Give it type hints "
                    "and a Google-style docstring with an Args: section, as TRL requires of tools."
                ) from None
        self.environment_factory = environment_factory
        self.name = environment_class.__name__
        # The registered environment inside, when ``as_trl_environment`` wrapped one by name; else None.
        self.environment_name: str | None = getattr(environment_factory, "environment_name", None)
        self.has_reward = callable(getattr(probe, "get_reward", None))
        self.tool_schemas = schemas
        self.action_tag = ACTION_TAG

    def __call__(self, spec: dict[str, Any]) -> "TRLStyleEnv":
        return TRLStyleEnv(self.environment_factory(), spec, self.action_tag, self.tool_schemas)

    def reward_function(self) -> Callable[..., list[float]]:
        """The reward function of ``get_reward``: the trajectory's environment reward, named after the class
        (TRL's name for its ``get_reward`` column)."""

        def reward(completions: list, env_reward: list[float], **kwargs: Any) -> list[float]:
            return [float(r) for r in env_reward]

        reward.__name__ = reward.__qualname__ = self.name
        return reward


class TRLStyleEnv:
    """One episode of a TRL-style environment instance, in our environment protocol."""

    def __init__(self, instance: Any, spec: dict[str, Any], action_tag: str, tool_schemas: list[dict[str, Any]]):
        self.instance = instance
        self.action_tag = action_tag
        self.env_name = type(instance).__name__
        self.max_turns = int(getattr(instance, "max_turns", DEFAULT_MAX_TURNS))
        prompt = spec.get(PROMPT_COLUMN)
        self.row = {k: v for k, v in spec.items() if k not in _NOT_RESET_KWARGS}
        if prompt is not None:
            self.row["prompt"] = prompt
        self._task = _prompt_text(prompt) or f"use the tools of {self.env_name} to complete the task"
        self._tools = {name: getattr(instance, name) for name in environment_tools(type(instance))}
        self.instructions = _instructions(action_tag, tool_schemas)
        if "task_type" in spec:
            self.task_type = spec["task_type"]

    @property
    def task(self) -> str:
        return self._task

    @property
    def admissible_commands(self) -> None:
        return None

    def reset(self) -> str:
        return _text(_resolved(self.instance.reset(**self.row)))

    def step(self, action: str) -> StepResult:
        if not action:  # no call: the model's final answer, which ends a TRL rollout
            return self._result("", done=True)
        try:
            call = parse_tool_call(action, self._tools)
        except ToolCallError as exc:
            return self._result(f"Invalid tool call: {exc}", done=False)
        try:
            observation = str(_resolved(self._tools[call.name](*call.args, **call.kwargs)))
        except Exception as exc:  # TRL answers a failing tool with its error, and the rollout goes on
            observation = f"Error: {exc}"
        return self._result(observation, done=bool(getattr(self.instance, "done", False)))

    def _result(self, observation: str, done: bool) -> StepResult:
        reward = float(_resolved(self.instance.get_reward())) if callable(getattr(self.instance, "get_reward", None)) else 0.0
        won = bool(getattr(self.instance, "won", reward > 0))
        return StepResult(observation, reward, done, {"won": won})

    def close(self) -> None:
        close = getattr(self.instance, "close", None)
        if callable(close):
            close()


def _instructions(action_tag: str, tool_schemas: list[dict[str, Any]]) -> str:
    if action_tag == TOOL_CALL_TAG:  # the chat template lists the tools and their format in the system prompt
        return "Call one tool per turn. Answer without a tool call when you are done."
    lines = ["Tools:"]
    for schema in tool_schemas:
        function = schema["function"]
        params = function.get("parameters", {}).get("properties", {})
        signature = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in params.items())
        lines.append(f"- {function['name']}({signature}): {function.get('description', '')}")
        lines += [f"    {name}: {spec['description']}" for name, spec in params.items() if spec.get("description")]
    lines.append(
        "Call one tool per turn as a Python call with literal arguments inside the action block, e.g. "
        f"<action>{tool_schemas[0]['function']['name']}(...)</action>. Answer without an action block when you are done."
    )
    params = tool_schemas[0]["function"].get("parameters", {}).get("properties", {})
    if len(tool_schemas) == 1 and [p.get("type") for p in params.values()] == ["string"]:
        lines.append(f"Text that is no call is the {next(iter(params))} of {tool_schemas[0]['function']['name']}.")
    return "\n".join(lines)


def keep_prompt_column(dataset: Any) -> Any:
    """``dataset`` with each row's ``prompt`` copied to ``PROMPT_COLUMN``, so that ``reset(**row)`` receives it
    (a dict of datasets, as ``eval_dataset`` may be, column by column; None stays None)."""
    if dataset is None:
        return None
    if isinstance(dataset, Mapping):
        return {name: keep_prompt_column(part) for name, part in dataset.items()}
    return dataset.map(lambda row: {PROMPT_COLUMN: row.get("prompt")})


# ---- the other way round: our environments in TRL ----------------------------------------------------------


class TRLEnvironment:
    """One of our environments behind TRL's environment API (made by ``as_trl_environment``).

    ``done``, ``won`` and ``reward`` describe the current episode; only ``act`` is a tool.
    """

    def __init__(self, env_factory: EnvFactory, max_turns: int | None = None):
        self._factory = env_factory
        self._max_turns = max_turns
        self._env: Any = None
        self._limit = 0
        self.turns = 0
        self.done = True
        self.won = False
        self.reward = 0.0

    def reset(self, **row: Any) -> str:
        """Starts the episode named by the row (its columns, or the JSON task spec in its ``prompt``) and returns
        the task, the first observation and the admissible actions."""
        self._close()
        self._env = self._factory(task_spec_from_row(row))
        observation = self._env.reset()
        own_limit = int(getattr(self._env, "max_turns", DEFAULT_MAX_TURNS))
        self._limit = min(own_limit, self._max_turns or own_limit)
        self.turns, self.done, self.won, self.reward = 0, False, False, 0.0
        parts = [f"Your task is: {self._env.task}", f"Observation: {observation}"]
        instructions = getattr(self._env, "instructions", "")
        return "\n".join(parts + ([instructions] if instructions else []) + self._admissible())

    def act(self, action: str) -> str:
        """Takes one action in the environment.

        Args:
            action: The command to perform, for example one of the admissible actions listed with the last observation.

        Returns:
            What the environment shows after the action.
        """
        if self._env is None or self.done:
            raise ValueError("The episode is over; answer without calling a tool.")
        result = self._env.step(action)
        observation, reward, done, info = result if isinstance(result, StepResult) else StepResult(*result)
        self.turns += 1
        self.reward, self.won = float(reward), bool((info or {}).get("won", False))
        self.done = bool(done) or self.turns >= self._limit
        ending = ["The episode is over."] if self.done else self._admissible()
        return "\n".join([str(observation)] + ending)

    def get_reward(self) -> float:
        """The environment's reward for the episode so far (its terminal reward once it is over)."""
        return self.reward

    def _admissible(self) -> list[str]:
        admissible = getattr(self._env, "admissible_commands", None)
        return [f"Admissible actions: {', '.join(admissible)}"] if admissible else []

    def _close(self) -> None:
        if self._env is not None and hasattr(self._env, "close"):
            self._env.close()
        self._env = None

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # interpreter shutdown: the environment's modules may be gone
            pass


def as_trl_environment(environment: str | EnvFactory, max_turns: int | None = None) -> Callable[[], TRLEnvironment]:
    """An ``environment_factory`` for ``trl.GRPOTrainer`` running one of our environments: a registered name
    (``"alfworld"``, ``"webshop"``, ``"search"``, or yours from ``register_env``) or an ``EnvFactory``.
    ``max_turns`` caps the environment's own turn limit; past it, ``act`` answers that the episode is over."""
    if isinstance(environment, str):
        from . import get_env_factory

        factory = get_env_factory(environment)
    elif callable(environment):
        factory = environment
    else:
        raise TypeError(f"as_trl_environment takes an environment name or an EnvFactory, got {environment!r}.")
    made = functools.partial(TRLEnvironment, factory, max_turns=max_turns)
    made.environment_name = environment if isinstance(environment, str) else None  # read by TRLStyleEnvFactory
    return made


def refuse_ignored_trainer_arguments(
    trainer_kwargs: Mapping[str, Any],
    args: Any,
    train_dataset: Any,
    environment_factory: Any,
    env_factory: Any,
) -> None:
    """Refuses, with the fix, what an agent trainer (``AgentGRPOTrainer`` and its subclasses) would ignore: TRL's
    ``rollout_func`` and ``tools`` (the batched agent loop replaces TRL's generation and tool loop), and next to
    ``environment_factory`` an ``env_factory``, TRL's ``max_tool_calling_iterations`` or a missing dataset."""
    if trainer_kwargs.get("rollout_func") is not None:
        raise ValueError(
            "rollout_func is not used by the agent trainers: their batched agent loop plays the episodes. Pass the "
            "environment as env_factory= (taspo_trl's protocol) or environment_factory= (TRL's), or keep "
            "trl.GRPOTrainer with rollout_func=taspo_trl.make_rollout_func(...)."
        )
    if trainer_kwargs.get("tools"):
        raise ValueError(
            "tools= is not used by the agent trainers: the model acts only on its environment. Make the tools "
            "methods of a TRL-style environment class and pass environment_factory=YourEnvironment."
        )
    if environment_factory is None:
        return
    if env_factory is not None:
        raise ValueError(
            "Pass either env_factory= (taspo_trl's environment protocol) or environment_factory= (TRL's), not both."
        )
    if getattr(args, "max_tool_calling_iterations", None) is not None:
        raise ValueError(
            "max_tool_calling_iterations limits TRL's own tool loop, which the agent trainers do not run. Leave it "
            "unset and set max_turns (the turns, i.e. tool calls, per episode) instead."
        )
    if train_dataset is None:
        raise ValueError(
            "The agent trainers need a train_dataset with environment_factory: one row per task, whose columns "
            "reach reset(**row) (e.g. Dataset.from_list([{'prompt': 'Find the key.'}] * 64))."
        )
