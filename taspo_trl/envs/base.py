"""The environment protocol every benchmark adapter implements, and the agent prompt built from it.

An environment is one episode of one task. The agent loop creates it from a task spec (a dict taken from a
dataset row), calls ``reset()`` once, then ``step(action)`` with the action text extracted from the model's
``<action>...</action>`` block (the empty string when the response had no valid block). Malformed or
non-admissible actions are normal: the environment answers as the real game would and never raises.

Optional attributes an environment may define (the agent loop reads them with defaults):

- ``action_tags`` (tuple of str, default ``(action_tag,)``): the tags the policy may answer with. With one tag,
  ``step`` receives the block's stripped content. With several (Search-QA's ``("search", "answer")``), ``step``
  receives the first complete block in canonical form, ``"<search>query</search>"``, and parses it itself.
- ``instructions`` (str): extra prompt text that explains the action format, shown before the closing line.
- ``step_many(envs, actions)`` (a staticmethod): steps several episodes of this class at once and returns one
  ``StepResult`` each, e.g. to send one batched retrieval request for all live trajectories of a turn.
- ``task_type`` (str): the task family or dataset name that evaluation tables group by.
- ``info["score"]`` (float): a graded score next to the binary ``info["won"]`` (WebShop's score, Search-QA's EM).
- ``stall_commands`` (tuple of str): commands that change nothing (ALFWorld's ``look``, ``inventory``), which the
  expert demonstrations can inject as stalls to recover from (``play_expert``'s ``stall_rate``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

ACTION_TAGS: tuple[str, ...] = ("action", "search", "answer")
"""Every action tag the shipped environments use: where no environment is at hand (stripping action blocks from
a response), a block of any of them counts as the action."""


def normalize_command(command: str) -> str:
    """A command as environments compare it with the commands they accept: single spaces, no outer whitespace,
    lowercase (a policy's ``Go to  Drawer 1`` is ``go to drawer 1``)."""
    return " ".join(command.split()).lower()


def matching_command(command: str, accepted: Sequence[str]) -> str:
    """The accepted command that ``command`` names as ``normalize_command`` compares them, else ``command``."""
    wanted = normalize_command(command)
    return next((c for c in accepted if normalize_command(c) == wanted), command)


@dataclass
class StepResult:
    """What one environment step returns (the classic ``(obs, reward, done, info)`` tuple, named)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    def __iter__(self):
        return iter((self.observation, self.reward, self.done, self.info))


@runtime_checkable
class AgentEnv(Protocol):
    """One episode of a text environment.

    ``info`` from ``step`` carries at least ``"won"`` (bool, the verified success) and, where the environment
    has them, ``"admissible_commands"`` (list of str). ``task`` is the task statement shown to the agent;
    ``admissible_commands`` is the current list (``None`` when the action space is open, e.g. search).
    """

    max_turns: int
    action_tag: str

    def reset(self) -> str: ...

    def step(self, action: str) -> StepResult: ...

    @property
    def task(self) -> str: ...

    @property
    def admissible_commands(self) -> list[str] | None: ...

    def close(self) -> None: ...


EnvFactory = Callable[[dict[str, Any]], AgentEnv]
"""Builds one episode from a task spec (a dataset row's fields, e.g. ``{"game_file": ...}``)."""

TaskRowBuilder = Callable[[Mapping[str, Any], "int | None"], list[dict[str, Any]]]
"""Builds the dataset rows, one task each, that ``taspo-train`` and ``taspo-eval`` run an environment on.

Called as ``rows(settings, max_turns)``: ``settings`` are the task-selection arguments of the command line as a
mapping (``task_source``, ``task_split``, ``max_tasks``, ``games_seed``, ...; ``taspo-eval`` sets ``task_split``
to the split it evaluates), ``max_turns`` the config's turn cap (``None``: the environment's own). Each row
names its task as columns or as a JSON object in ``prompt`` (``encode_task_prompt``); an empty list is an error.
"""


def encode_task_prompt(spec: dict[str, Any]) -> str:
    """A task spec as the ``prompt`` of a dataset row, so that TRL's ``rollout_func``, which sees only prompts,
    gets the whole task (``task_spec_from_row`` reads it back)."""
    return json.dumps(spec, sort_keys=True)


def task_spec_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """The task spec of a dataset row: its fields, plus the JSON object its ``prompt`` may hold.

    TRL's ``rollout_func`` only receives prompts, so rows built by ``encode_task_prompt`` or an
    environment's ``task_spec_rows`` carry the whole spec in ``prompt``; other columns are merged on top.
    """
    spec: dict[str, Any] = {}
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):  # conversational rows
        prompt = prompt[-1].get("content", "")
    if isinstance(prompt, str):
        try:
            decoded = json.loads(prompt)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            spec.update(decoded)
    spec.update({k: v for k, v in row.items() if k != "prompt"})
    if not spec:
        raise ValueError(
            f"Cannot read a task from the row {str(row)[:160]!r}. Agent datasets name their task either in "
            "columns (e.g. `game_file`) or in the `prompt` column as a JSON object built with "
            "`taspo_trl.encode_task_prompt({...})` / the environment's `task_spec_rows(...)`."
        )
    return spec


@dataclass
class PromptTemplate:
    """The agent prompt of one turn (TASPO A.3, verl-agent's convention).

    The prompt shows the task, a window of the most recent ``history_window`` (observation, action) pairs,
    the current observation, the admissible actions when the environment lists them, and the instruction to
    reason inside ``<think>...</think>`` and then answer with exactly one ``<action>...</action>`` block.
    """

    history_window: int = 3
    max_observation_chars: int = 1200
    max_admissible: int = 60

    def render(
        self,
        task: str,
        observation: str,
        history: list[tuple[str, str]],
        admissible: list[str] | None,
        turn: int,
        action_tags: str | tuple[str, ...] = "action",
        extra_instructions: str = "",
    ) -> str:
        lines = [f"You are an expert agent operating in a text environment. Your task is: {task}"]
        recent = history[-self.history_window :] if self.history_window > 0 else []
        if recent:
            first = turn - len(recent) + 1
            lines.append(f"Your {len(recent)} most recent steps (of {turn} so far):")
            for k, (obs, act) in enumerate(recent):
                lines.append(f"[Step {first + k}] Observation: {_clip(obs, self.max_observation_chars)}")
                lines.append(f"[Step {first + k}] Action: {act}")
        lines.append(f"Current observation (step {turn + 1}): {_clip(observation, self.max_observation_chars)}")
        lines += self._closing(admissible, action_tags, extra_instructions)
        return "\n".join(lines)

    def render_followup(
        self, observation: str, admissible: list[str] | None, turn: int, action_tags: str | tuple[str, ...] = "action"
    ) -> str:
        """The user message of a later turn in the ``sequence`` layout, where the history is in context."""
        lines = [f"Observation (step {turn + 1}): {_clip(observation, self.max_observation_chars)}"]
        return "\n".join(lines + self._closing(admissible, action_tags, ""))

    def _closing(
        self, admissible: list[str] | None, action_tags: str | tuple[str, ...], extra_instructions: str
    ) -> list[str]:
        lines = []
        if admissible:
            shown = admissible[: self.max_admissible]
            more = "" if len(admissible) <= len(shown) else f" (and {len(admissible) - len(shown)} more)"
            lines.append("Admissible actions: " + ", ".join(f"'{a}'" for a in shown) + more)
        if extra_instructions:
            lines.append(extra_instructions)
        tags = (action_tags,) if isinstance(action_tags, str) else tuple(action_tags)
        blocks = " or ".join(f"<{tag}> </{tag}>" for tag in tags)
        lines.append(f"First reason step by step inside <think> </think>. Then give exactly one action inside {blocks}.")
        return lines


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"
