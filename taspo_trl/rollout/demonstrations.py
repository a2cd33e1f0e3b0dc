"""Expert demonstrations in the agent loop's own prompt and response format, as a TRL prompt-completion dataset.

Two passes per task:
1. the environment's expert (``taspo_trl.envs.get_expert_factory``) plays a fresh episode and records a
   (thought, action) pair per turn; an episode it does not win is dropped with a warning;
2. those responses, ``<think>thought</think> <action>action</action>`` and EOS, are replayed through the real
   ``run_agent_loop`` with the real environment, so every prompt is exactly the one the policy will see during
   RL, in either layout and with any history window, and the replay's verified win is checked again.

``demonstration_dataset`` turns the replayed trajectories into TRL's conversational prompt-completion rows: in
the ``turn`` layout the prompt is that turn's single user message; in the ``sequence`` layout it is the whole
conversation so far (earlier responses included). ``SFTTrainer`` with ``completion_only_loss`` then trains on
the responses alone.

``relabelled_dataset`` is the DAgger step (Ross et al., 2011): the policy's own episodes are replayed through
the environment with the expert following along (``observe``), and every state where the policy did something
else than the expert would have gets a row with the expert's response. These are the states a policy trained on
the expert's episodes alone reaches by its own mistakes and has never seen a demonstration of.

A policy that has only seen flawless episodes does not know what to do after its own mistake, and tends to
repeat it. ``mistake_rate`` therefore lets the expert's episodes contain injected mistakes (a repeated command),
and ``stall_rate`` stalls (a command that changes nothing, such as ALFWorld's ``look``); the dataset keeps the
expert's recoveries from them and drops the mistakes themselves.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..envs import EnvFactory, ExpertFactory, PromptTemplate, get_env_factory, get_expert_factory
from ..envs.base import normalize_command
from .chat import ChatFormat
from .env_pool import EnvPool
from .generation import Generation
from .loop import run_agent_loop
from .records import Trajectory

logger = logging.getLogger(__name__)


def expert_response(thought: str, action: str, action_tags: Sequence[str]) -> str:
    """The response text the policy should write: the thought, then the action block.

    With one action tag the action is the block's content; environments with several tags (Search-QA) take the
    canonical block itself, ``<search>query</search>``, as their action.
    """
    block = action if len(action_tags) > 1 else f"<{action_tags[0]}>{action}</{action_tags[0]}>"
    return f"<think>{thought}</think> {block}"


class ExpertEpisode(NamedTuple):
    """What one expert episode left: its responses (one per turn), whether it won, and the turns that were
    injected mistakes rather than the expert's own choice."""

    responses: list[str]
    won: bool
    mistakes: frozenset[int]


def play_expert(
    spec: Mapping[str, Any], env_factory: EnvFactory, expert_factory: ExpertFactory, rng: random.Random,
    max_turns: int | None = None, mistake_rate: float = 0.0, wander_rate: float = 0.0, informed: bool = False,
    stall_rate: float = 0.0,
) -> ExpertEpisode:
    """One expert episode of ``spec``.

    With ``mistake_rate`` > 0, after any turn but the first the previous response is sent again with that
    probability (never twice in a row) and the expert is not asked: the policy's commonest failure, repeating a
    command the game answers with "Nothing happens.". The expert then recovers from the state the repeat left.

    With ``wander_rate`` > 0, a turn that is not a repeat plays a random admissible command with that probability
    (never twice in a row): a wrong object taken, a wrong place visited, the object put down elsewhere. The
    expert follows it (``observe``; the ALFWorld expert has it) and recovers.

    With ``stall_rate`` > 0, a turn that is neither plays one of the environment's ``stall_commands`` (ALFWorld:
    ``look``, ``inventory``) with that probability (never right after another mistake): the state of a policy that
    stalls, whose recovery the expert then shows. All three kinds count as mistakes. With a rate of 0 a kind draws
    no random number, so the episodes of the other settings stay as they were.

    ``informed`` builds the expert with ``informed=True`` (see ``taspo_trl.envs.ExpertFactory``).
    """
    env = env_factory(dict(spec))
    try:
        observation = env.reset()
        expert = expert_factory(spec, env, informed=True) if informed else expert_factory(spec, env)
        tags = tuple(getattr(env, "action_tags", None) or (env.action_tag,))
        limit = min(env.max_turns, max_turns or env.max_turns)
        responses: list[str] = []
        actions: list[str] = []
        mistakes: set[int] = set()
        if wander_rate > 0 and not hasattr(expert, "observe"):
            raise ValueError(f"wander_rate needs an expert that follows others' commands (observe); "
                             f"{type(expert).__name__} has none. Use mistake_rate instead.")
        stalls = tuple(getattr(env, "stall_commands", ()))
        if stall_rate > 0 and not stalls:
            raise ValueError(f"stall_rate needs an environment with commands that change nothing (stall_commands); "
                             f"{type(env).__name__} has none. Use mistake_rate instead.")
        for turn in range(limit):
            admissible = list(env.admissible_commands or [])
            may_inject, injected = turn - 1 not in mistakes, True
            if turn > 0 and may_inject and mistake_rate > 0 and rng.random() < mistake_rate:
                response, action = responses[-1], actions[-1]
            elif may_inject and wander_rate > 0 and rng.random() < wander_rate:
                action = rng.choice(admissible)
                response = expert_response("Trying something.", action, tags)
            elif may_inject and stall_rate > 0 and rng.random() < stall_rate:
                action = rng.choice(stalls)
                response = expert_response("Looking around once more.", action, tags)
            else:
                injected = False
                thought, action = expert(observation, admissible, rng)
                response = expert_response(thought, action, tags)
            if injected:
                mistakes.add(turn)
            responses.append(response)
            actions.append(action)
            result = env.step(action)
            if hasattr(expert, "observe"):
                expert.observe(action, admissible)
            observation = result.observation
            if result.done:
                return ExpertEpisode(responses, bool(result.info.get("won", False)), frozenset(mistakes))
        return ExpertEpisode(responses, False, frozenset(mistakes))
    finally:
        env.close()


def _factories(
    environment: str | None, env_factory: EnvFactory | None, expert_factory: ExpertFactory | None
) -> tuple[EnvFactory, ExpertFactory]:
    """The given factories, the missing ones taken from the registered ``environment``."""
    if env_factory is None or expert_factory is None:
        if environment is None:
            raise ValueError("Pass environment= (a registered name) or both env_factory= and expert_factory=.")
        env_factory = env_factory or get_env_factory(environment)
        expert_factory = expert_factory or get_expert_factory(environment)
    return env_factory, expert_factory


class Demonstration(NamedTuple):
    """A replayed expert episode and the turns of it that were injected mistakes."""

    trajectory: Trajectory
    mistakes: frozenset[int]


class _ReplayGenerator:
    """Answers turn c of trajectory k with ``responses[k][c]`` (token ids ending in EOS); no model involved."""

    def __init__(self, responses: list[list[list[int]]]):
        self.responses = responses
        self.calls = 0

    def __call__(self, prompts: list[list[int]]) -> list[Generation]:
        live = [k for k, turns in enumerate(self.responses) if len(turns) > self.calls]
        if len(live) != len(prompts):
            raise RuntimeError(
                f"demonstration replay, turn {self.calls}: {len(prompts)} live episodes but {len(live)} expert "
                "responses; the environment did not behave as it did for the expert (is it deterministic?)"
            )
        self.calls += 1
        return [Generation(list(self.responses[k][self.calls - 1]), [0.0] * len(self.responses[k][self.calls - 1]), True) for k in live]


def expert_demonstrations(
    specs: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    environment: str | None = None,
    env_factory: EnvFactory | None = None,
    expert_factory: ExpertFactory | None = None,
    layout: str = "turn",
    history_window: int = 3,
    template: PromptTemplate | None = None,
    max_turns: int | None = None,
    max_prompt_tokens: int | None = None,
    seed: int = 0,
    mistake_rate: float = 0.0,
    wander_rate: float = 0.0,
    informed: bool = False,
    stall_rate: float = 0.0,
) -> list[Demonstration]:
    """Winning expert trajectories of ``specs``, recorded by the real agent loop (prompt and response ids and
    texts per turn), in input order, each with its injected mistakes; tasks the expert does not win are left
    out with a warning.

    Args:
        specs: task specs (``taspo_trl.task_spec_from_row`` of dataset rows).
        tokenizer: the policy's tokenizer; its chat template renders the prompts.
        environment: a registered environment name; gives ``env_factory`` and ``expert_factory`` defaults.
        layout, history_window, template, max_turns, max_prompt_tokens: as in the trainer's config, so the
            demonstrations show the policy the prompts it will get in training.
        seed: picks the thoughts' wordings (and the expert's other random choices).
        mistake_rate: per-turn probability of an injected repeat of the previous command (see ``play_expert``).
            ``demonstration_dataset`` trains on the recoveries from those turns, never on the mistakes.
        wander_rate: per-turn probability of an injected random admissible command (see ``play_expert``),
            treated like a mistake.
        informed: play with experts that know where things are (``play_expert``).
        stall_rate: per-turn probability of an injected command that changes nothing (the environment's
            ``stall_commands``, see ``play_expert``), treated like a mistake.
    """
    env_factory, expert_factory = _factories(environment, env_factory, expert_factory)
    rng = random.Random(seed)
    played = [
        play_expert(spec, env_factory, expert_factory, rng, max_turns, mistake_rate, wander_rate, informed, stall_rate)
        for spec in specs
    ]
    kept = [i for i, episode in enumerate(played) if episode.won]
    for i in sorted(set(range(len(specs))) - set(kept)):
        logger.warning("the expert did not win task %d (%s) within the turn limit; no demonstration for it",
                       i, str(specs[i].get("task", ""))[:80])
    if not kept:
        raise ValueError(f"The expert won none of the {len(specs)} tasks; check the tasks and max_turns={max_turns}.")
    eos = [tokenizer.eos_token_id]
    responses = [[tokenizer(text, add_special_tokens=False)["input_ids"] + eos for text in played[i].responses] for i in kept]
    pool = EnvPool(env_factory)
    try:
        trajectories = run_agent_loop(
            [dict(specs[i]) for i in kept],
            pool,
            _ReplayGenerator(responses),
            ChatFormat(tokenizer),
            layout=layout,
            template=template or PromptTemplate(history_window=history_window),
            max_turns=max_turns,
            max_prompt_tokens=max_prompt_tokens,
        )
    finally:
        pool.shutdown()
    for trajectory, i in zip(trajectories, kept, strict=True):
        if not trajectory.won or len(trajectory.turns) != len(played[i].responses):
            raise RuntimeError(
                f"Replaying the expert's episode of task {i} through the agent loop did not win in the same "
                f"{len(played[i].responses)} turns (won={trajectory.won}, turns={len(trajectory.turns)}, "
                f"truncated={trajectory.truncated}); is max_prompt_tokens={max_prompt_tokens} too small?"
            )
    return [Demonstration(t, played[i].mistakes) for t, i in zip(trajectories, kept, strict=True)]


def demonstration_dataset(demonstrations: Sequence[Demonstration], layout: str = "turn") -> Any:
    """TRL's conversational prompt-completion ``datasets.Dataset``, one row per expert turn; injected mistakes
    get no row (the policy must not learn them), but the turns after them do, with the mistake in their prompt.

    Columns: ``prompt`` and ``completion`` (lists of chat messages), plus ``task_type`` and ``turn`` for
    inspection. ``layout`` must be the one the demonstrations were recorded in.
    """
    from datasets import Dataset

    rows = []
    for trajectory, mistakes in demonstrations:
        conversation: list[dict[str, str]] = []
        for t, turn in enumerate(trajectory.turns):
            user = {"role": "user", "content": turn.prompt_text}
            prompt = [user] if layout == "turn" else [*conversation, user]
            reply = {"role": "assistant", "content": turn.response_text}
            if t not in mistakes:
                rows.append({
                    "prompt": prompt, "completion": [reply], "task_type": trajectory.task_type or "", "turn": t,
                })
            conversation = [*prompt, reply]
    return Dataset.from_list(rows)


def relabelled_dataset(
    trajectories: Sequence[Trajectory],
    *,
    environment: str | None = None,
    env_factory: EnvFactory | None = None,
    expert_factory: ExpertFactory | None = None,
    layout: str = "turn",
    seed: int = 0,
    strict: bool = False,
) -> Any:
    """The expert's corrections of the policy's own episodes, as ``demonstration_dataset`` rows.

    Each trajectory (recorded by ``run_agent_loop`` in ``layout``) is replayed command by command in a fresh
    environment while its expert follows along; at every turn the expert says what it would do from that state,
    and a turn where the policy's command differs (or was not a valid action) becomes a row: the policy's prompt,
    the expert's response. A trajectory stops giving rows where the environment answers differently than during
    the rollout, or where the expert cannot go on (it logs why). The expert needs an ``observe(command,
    admissible)`` method (the ALFWorld expert has one); an ``agrees(command, suggested)`` method, if it has one,
    accepts commands as good as its own (ALFWorld: searching another plausible receptacle), which then get no row;
    with ``strict`` every command other than the expert's own gets one.
    """
    from datasets import Dataset

    env_factory, expert_factory = _factories(environment, env_factory, expert_factory)
    rng = random.Random(seed)
    rows = []
    for k, trajectory in enumerate(trajectories):
        if trajectory.error is not None:
            continue
        env = env_factory(dict(trajectory.task_spec))
        try:
            observation = env.reset()
            expert = expert_factory(trajectory.task_spec, env)
            if not hasattr(expert, "observe"):
                raise ValueError(f"{type(expert).__name__} has no observe(command, admissible) method, so it cannot "
                                 "follow a policy's episode; relabelling needs one.")
            tags = tuple(getattr(env, "action_tags", None) or (env.action_tag,))
            agrees = _same_command if strict else getattr(expert, "agrees", None) or _same_command
            conversation: list[dict[str, str]] = []
            for t, turn in enumerate(trajectory.turns):
                admissible = list(env.admissible_commands or [])
                try:
                    thought, action = expert(observation, admissible, rng)
                except ValueError as error:
                    logger.info("relabelling trajectory %d stops at turn %d: %s", k, t, error)
                    break
                user = {"role": "user", "content": turn.prompt_text}
                prompt = [user] if layout == "turn" else [*conversation, user]
                played = turn.action if turn.action_valid else ""
                if not agrees(played, action):
                    reply = {"role": "assistant", "content": expert_response(thought, action, tags)}
                    task_type = trajectory.task_type or ""
                    rows.append({"prompt": prompt, "completion": [reply], "task_type": task_type, "turn": t})
                conversation = [*prompt, {"role": "assistant", "content": turn.response_text}]
                result = env.step(played)
                expert.observe(played, admissible)
                if result.observation != turn.observation:
                    logger.warning("relabelling trajectory %d stops at turn %d: the environment answered differently "
                                   "than during the rollout (is it deterministic?)", k, t)
                    break
                observation = result.observation
        finally:
            env.close()
    return Dataset.from_list(rows) if rows else Dataset.from_dict(
        {"prompt": [], "completion": [], "task_type": [], "turn": []}
    )


def _same_command(command: str, suggested: str) -> bool:
    return normalize_command(command) == normalize_command(suggested)
