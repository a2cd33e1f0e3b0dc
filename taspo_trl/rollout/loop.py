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
from typing import Any, Callable

from ..envs.base import PromptTemplate
from .chat import ChatFormat
from .env_pool import EnvPool
from .generation import Generator
from .records import Trajectory, Turn
from .spans import locate_action_span, parse_env_action

logger = logging.getLogger(__name__)

LAYOUTS = ("turn", "sequence")
ACTION_TAGS = ("action", "search", "answer")


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
    tokenizer = chat.tokenizer
    keys = list(range(len(task_specs)))
    starts = pool.start(dict(zip(keys, task_specs, strict=True)))
    trajectories = []
    for key, spec in zip(keys, task_specs, strict=True):
        s = starts[key]
        trajectories.append(
            Trajectory(
                task_spec=spec,
                task=s.task,
                initial_observation=s.observation,
                group=key // max(group_size, 1),
                env_name=s.env_name,
                task_type=s.task_type or spec.get("task_type"),
                error=s.error,
            )
        )
    limit = {k: min(starts[k].max_turns, max_turns or starts[k].max_turns) for k in keys}
    observation = {k: starts[k].observation for k in keys}
    admissible = {k: starts[k].admissible for k in keys}
    history: dict[int, list[tuple[str, str]]] = {k: [] for k in keys}
    sequence_ids: dict[int, list[int]] = {}
    live = [k for k in keys if starts[k].error is None and limit[k] > 0]
    stop_texts = {}

    turn = 0
    while True:
        if any_process_live is not None:
            if not any_process_live(bool(live)):
                break
        elif not live:
            break
        prompts: dict[int, tuple[list[int], str]] = {}
        for k in list(live):
            tags = starts[k].action_tags or (starts[k].action_tag,)
            # A spec's "guidance" (e.g. Skill-GRPO's retrieved skills) is shown to the policy with the env's own text.
            instructions = "\n".join(x for x in (starts[k].instructions, task_specs[k].get("guidance", "")) if x)
            if layout == "turn" or turn == 0:
                text = template.render(
                    trajectories[k].task, observation[k], history[k], admissible[k], turn, tags, instructions
                )
                ids = chat.first_prompt_ids(text)
            else:
                text = template.render_followup(observation[k], admissible[k], turn, tags)
                ids = sequence_ids[k] + chat.continuation_ids(text, stop_texts.get(k, ""))
            if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
                logger.info("trajectory %d ends at turn %d: prompt of %d tokens exceeds %d", k, turn, len(ids), max_prompt_tokens)
                trajectories[k].truncated = True
                live.remove(k)
                continue
            prompts[k] = (ids, text)
        order = [k for k in live if k in prompts]
        generations = generate([prompts[k][0] for k in order])
        actions: dict[int, str] = {}
        for k, gen in zip(order, generations, strict=True):
            response_text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            parsed = parse_env_action(response_text, starts[k].action_tags or (starts[k].action_tag,))
            span = locate_action_span(tokenizer, gen.token_ids, response_text, tags=ACTION_TAGS)
            trajectories[k].turns.append(
                Turn(
                    prompt_ids=prompts[k][0],
                    response_ids=gen.token_ids,
                    logprobs=gen.logprobs,
                    response_text=response_text,
                    action=parsed.action,
                    action_valid=parsed.valid,
                    action_reason=parsed.reason,
                    action_span=span,
                    observation="",
                    prompt_text=prompts[k][1],
                )
            )
            stop_texts[k] = tokenizer.decode(gen.token_ids[-1:]) if gen.stopped else ""
            sequence_ids[k] = prompts[k][0] + gen.token_ids
            actions[k] = parsed.action if parsed.valid else ""
        results = pool.step(actions) if actions else {}
        finished = []
        for k, result in results.items():
            record = trajectories[k].turns[-1]
            record.observation = result.observation
            record.reward = float(result.reward)
            history[k].append((observation[k], record.action if record.action_valid else record.response_text[-200:]))
            observation[k] = result.observation
            info = result.info or {}
            admissible[k] = info.get("admissible_commands", admissible[k])
            if info.get("error"):
                trajectories[k].error = str(info["error"])
            if result.done or len(trajectories[k].turns) >= limit[k]:
                trajectories[k].won = bool(info.get("won", False))
                trajectories[k].reward = float(result.reward)
                trajectories[k].truncated = not result.done or bool(info.get("truncated", False))
                finished.append(k)
        for k in finished:
            live.remove(k)
        turn += 1
        if on_turn is not None:
            on_turn(turn, len(live))
    pool.close(keys)
    for trajectory in trajectories:
        invalid = sum(not t.action_valid for t in trajectory.turns)
        trajectory.reward -= invalid_action_penalty * invalid
    return trajectories

