"""The batched multi-turn agent loop.

Each turn, every live trajectory of the batch gets its prompt, ALL of them are generated in one batched
call, their action blocks are parsed and located, and the environments step (concurrently when the pool
has workers). Finished trajectories drop out; the loop ends when none is live or the turn limit is hit.

Two ways to build the prompt of a turn (the row ``layout``):
- ``"turn"``: a fresh prompt per turn with the task, a window of recent (observation, action) pairs and the
  current observation (TASPO A.3 / verl-agent): bounded prompt length, needed for 50-turn ALFWorld.
- ``"sequence"``: one growing conversation; the policy sees its exact history.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from ..envs.base import PromptTemplate, StepResult
from .chat import ChatFormat
from .env_pool import EnvPool, EpisodeStart
from .generation import Generation, Generator
from .records import Trajectory, Turn
from .spans import locate_action_span, parse_env_action

logger = logging.getLogger(__name__)

LAYOUTS = ("turn", "sequence")


def run_agent_loop(
    task_specs: list[dict[str, Any]],
    pool: EnvPool,
    generate: Generator,
    chat: ChatFormat,
    *,
    layout: str = "turn",
    template: PromptTemplate | None = None,
    max_turns: int | None = None,
    max_prompt_tokens: int | None = None,
    group_size: int = 1,
    invalid_action_penalty: float = 0.0,
    any_process_live: Callable[[bool], bool] | None = None,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """Plays one episode per task spec and returns one ``Trajectory`` each, in input order.

    Args:
        task_specs: one spec per rollout; the ``group_size`` siblings of a task are consecutive.
        pool: the environment pool (in-process or worker processes).
        generate: the batched generator (one call per turn over all live trajectories).
        chat: chat-template bookkeeping of the policy's tokenizer.
        layout: ``"turn"`` or ``"sequence"`` (see module docstring).
        template: the prompt template; default ``PromptTemplate()``.
        max_turns: caps each environment's own turn limit (ALFWorld 50, WebShop 15, Search-QA 4).
        max_prompt_tokens: a trajectory whose next prompt would exceed this ends, marked truncated.
        invalid_action_penalty: subtracted from the trajectory reward once per turn without a valid action.
        any_process_live: in multi-process runs with a collective generator (vLLM server), returns whether
            any process still has a live trajectory, so all processes call ``generate`` equally often.
        on_turn: progress callback ``(turn, live_count)``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    template = template or PromptTemplate()
    episodes = _start_episodes(task_specs, pool, group_size, max_turns)
    live = [episode for episode in episodes if episode.trajectory.error is None and episode.limit > 0]
    turn = 0
    while any_process_live(bool(live)) if any_process_live is not None else live:
        prompts = {}
        for episode in live:
            prompt = _turn_prompt(episode, turn, layout, template, chat)
            if max_prompt_tokens is not None and len(prompt[0]) > max_prompt_tokens:
                logger.info(
                    "trajectory %d ends at turn %d: prompt of %d tokens exceeds %d",
                    episode.key, turn, len(prompt[0]), max_prompt_tokens,
                )
                episode.trajectory.truncated = True
                continue
            prompts[episode.key] = prompt
        live = [episode for episode in live if episode.key in prompts]
        generations = generate([prompts[episode.key][0] for episode in live])
        actions = {
            episode.key: _record_turn(episode, *prompts[episode.key], generation, chat.tokenizer)
            for episode, generation in zip(live, generations, strict=True)
        }
        results = pool.step(actions) if actions else {}
        finished = {key for key, result in results.items() if _apply_step(episodes[key], result)}
        live = [episode for episode in live if episode.key not in finished]
        turn += 1
        if on_turn is not None:
            on_turn(turn, len(live))
    pool.close([episode.key for episode in episodes])
    for episode in episodes:
        invalid = sum(not t.action_valid for t in episode.trajectory.turns)
        episode.trajectory.reward -= invalid_action_penalty * invalid
    return [episode.trajectory for episode in episodes]


@dataclass
class Episode:
    """One trajectory while it is played: the record being filled in, and what its next prompt is built from."""

    key: int
    """Its position in the batch, also its key in the environment pool."""
    start: EpisodeStart
    trajectory: Trajectory
    limit: int
    """Turns it may take: the environment's own limit, capped by the loop's ``max_turns``."""
    instructions: str
    observation: str
    admissible: list[str] | None
    history: list[tuple[str, str]] = field(default_factory=list)
    """(observation, action) of each finished turn, for the ``turn`` layout's window."""
    sequence_ids: list[int] = field(default_factory=list)
    """The ``sequence`` layout's conversation so far: the last prompt and its response."""
    stop_text: str = ""
    """The text of the stop token that ended the last response ("" when it ran to the length limit)."""

    @property
    def action_tags(self) -> tuple[str, ...]:
        return self.start.action_tags or (self.start.action_tag,)


def _start_episodes(
    task_specs: list[dict[str, Any]], pool: EnvPool, group_size: int, max_turns: int | None
) -> list[Episode]:
    """Resets one environment per spec; siblings of a task (consecutive specs) share a group."""
    starts = pool.start(dict(enumerate(task_specs)))
    episodes = []
    for key, spec in enumerate(task_specs):
        s = starts[key]
        trajectory = Trajectory(
            task_spec=spec,
            task=s.task,
            initial_observation=s.observation,
            group=key // max(group_size, 1),
            env_name=s.env_name,
            task_type=s.task_type or spec.get("task_type"),
            error=s.error,
        )
        # A spec's "guidance" (e.g. Skill-GRPO's retrieved skills) is shown to the policy with the env's own text.
        instructions = "\n".join(x for x in (s.instructions, spec.get("guidance", "")) if x)
        limit = min(s.max_turns, max_turns or s.max_turns)
        episodes.append(Episode(key, s, trajectory, limit, instructions, s.observation, s.admissible))
    return episodes


def _turn_prompt(
    episode: Episode, turn: int, layout: str, template: PromptTemplate, chat: ChatFormat
) -> tuple[list[int], str]:
    """The prompt ids of this turn and the user text they end with."""
    tags = episode.action_tags
    if layout == "turn" or turn == 0:
        text = template.render(
            episode.trajectory.task, episode.observation, episode.history, episode.admissible, turn, tags,
            episode.instructions,
        )
        return chat.first_prompt_ids(text), text
    text = template.render_followup(episode.observation, episode.admissible, turn, tags)
    return episode.sequence_ids + chat.continuation_ids(text, episode.stop_text), text


def _record_turn(
    episode: Episode, prompt_ids: list[int], prompt_text: str, generation: Generation, tokenizer: Any
) -> str:
    """Appends the generated turn, its action parsed and located with the environment's own tags, and returns
    the action to send ("" when the response has no valid one)."""
    response_text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    parsed = parse_env_action(response_text, episode.action_tags)
    span = locate_action_span(tokenizer, generation.token_ids, response_text, tags=episode.action_tags)
    episode.trajectory.turns.append(
        Turn(
            prompt_ids=prompt_ids,
            response_ids=generation.token_ids,
            logprobs=generation.logprobs,
            response_text=response_text,
            action=parsed.action,
            action_valid=parsed.valid,
            action_reason=parsed.reason,
            action_span=span,
            observation="",
            prompt_text=prompt_text,
        )
    )
    episode.stop_text = tokenizer.decode(generation.token_ids[-1:]) if generation.stopped else ""
    episode.sequence_ids = prompt_ids + generation.token_ids
    return parsed.action if parsed.valid else ""


def _apply_step(episode: Episode, result: StepResult) -> bool:
    """Records the environment's answer to the last turn; True when the episode has ended."""
    record = episode.trajectory.turns[-1]
    record.observation = result.observation
    record.reward = float(result.reward)
    episode.history.append((episode.observation, record.action if record.action_valid else record.response_text[-200:]))
    episode.observation = result.observation
    info = result.info or {}
    episode.admissible = info.get("admissible_commands", episode.admissible)
    if info.get("error"):
        episode.trajectory.error = str(info["error"])
    episode.trajectory.faults += [f"{k}: {v}" for k, v in info.items() if k != "error" and str(k).endswith("_error") and v]
    if not result.done and len(episode.trajectory.turns) < episode.limit:
        return False
    episode.trajectory.won = bool(info.get("won", False))
    episode.trajectory.reward = float(result.reward)
    episode.trajectory.truncated = not result.done or bool(info.get("truncated", False))
    return True
