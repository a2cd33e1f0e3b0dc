"""Warm start by supervised fine-tuning on expert demonstrations, with TRL's own ``SFTTrainer``.

A small model that never writes a valid action gives GRPO, TASPO and AlignOPSD nothing to work with: every
group fails and every advantage is 0. A short SFT pass on the environment's expert demonstrations, rendered in
exactly the prompts the agent loop will show (``taspo_trl.rollout.demonstrations``), teaches the action format
and the basic moves, so that RL starts from groups with both successes and failures.

    config = AgentSFTConfig(output_dir="out", environment="alfworld", layout="turn", history_window=1)
    dataset = demonstration_sft_dataset(rows, tokenizer, config)
    AgentSFTTrainer(model=..., args=config, train_dataset=dataset, processing_class=tokenizer).train()

`AgentSFTTrainer` is TRL's `SFTTrainer` with two CPU speed-ups: its LM head scores only the response tokens, and
`frozen_layers` can keep the embeddings and the lowest decoder layers fixed. Plain `SFTTrainer` trains the same
model from the same dataset when `frozen_layers` is 0.
"""

from __future__ import annotations

import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Iterator, Sequence

import trl.trainer.utils as trl_utils
from trl import SFTConfig, SFTTrainer

from ..envs import get_env_factory, get_expert_factory
from ..model_card import AgentModelCard
from ..precision import resolve_config_precision
from ..envs.base import PromptTemplate, encode_task_prompt, task_spec_from_row
from ..privileged.analyzers import RuleBasedAnalyzer
from ..privileged.builder import build_group_pi
from ..privileged.rescoring import privileged_user_text
from ..rollout.chat import ChatFormat
from ..rollout.demonstrations import Demonstration, demonstration_dataset, expert_demonstrations, relabelled_dataset
from ..rollout.env_pool import EnvPool
from ..rollout.generation import TransformersGenerator
from ..rollout.loop import LAYOUTS, run_agent_loop
from ..rollout.records import Trajectory
from .trl_config import adopt_activation_checkpointing


_THOUGHT = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@dataclass
class AgentSFTConfig(SFTConfig):
    r"""Configuration of the demonstration warm start: every field of `trl.SFTConfig`, plus the agent prompt
    settings below, which must match the RL run that follows (same layout, window and turn cap).

    `completion_only_loss` defaults to `True` here: the loss covers the expert's responses, never the prompts.

    Parameters:
        environment (`str`, defaults to `"alfworld"`):
            Registered environment whose expert demonstrates (`taspo_trl.envs.register_expert` adds yours).
        layout (`str`, defaults to `"turn"`):
            Prompt layout of the demonstrations, as `AgentGRPOConfig.layout`: `"turn"` (one prompt per turn with
            the last `history_window` steps) or `"sequence"` (the whole conversation so far).
        history_window (`int`, defaults to `3`):
            Recent (observation, action) pairs in a `turn`-layout prompt, as `AgentGRPOConfig.history_window`.
        max_turns (`int` or `None`, defaults to `None`):
            Turn cap; an expert episode longer than this is left out. `None` keeps the environment's limit.
        max_prompt_tokens (`int` or `None`, defaults to `None`):
            Longest prompt, as `AgentGRPOConfig.max_prompt_tokens`; `None` = no cap.
        demonstration_seed (`int`, defaults to `0`):
            Seed of the expert's random choices (thought wordings, receptacles searched, injected mistakes).
        demonstrations_per_task (`int`, defaults to `1`):
            Expert episodes recorded per task row; they differ in the expert's random choices (for ALFWorld, the
            receptacles it searches first and where mistakes are injected).
        demonstration_mistake_rate (`float`, defaults to `0.0`):
            Per-turn probability that an expert episode repeats its previous command instead (a no-op in
            ALFWorld: "Nothing happens."); the model trains on the expert's recovery, not on the repeat.
        demonstration_wander_rate (`float`, defaults to `0.0`):
            Per-turn probability that an expert episode plays a random admissible command instead (ALFWorld: a
            wrong object taken, a wrong receptacle visited); the expert follows it and the model trains on the
            recovery, not on the random command. Needs an expert with `observe` (the ALFWorld one).
        demonstration_stall_rate (`float`, defaults to `0.0`):
            Per-turn probability that an expert episode plays a command that changes nothing instead (ALFWorld:
            `look` or `inventory`, its `stall_commands`): the state a stalling policy is in, whose recovery the
            model trains on. With `demonstration_foreign_pi_share` some of those states carry another task's
            privileged context, and with `demonstration_pi_corrections` the task's own, so the policy learns to
            leave a stall where its own $P_i$ says and to ignore a foreign one there too.
        demonstration_pi_episodes (`int`, defaults to `0`):
            Of the `demonstrations_per_task` episodes per task, how many are played by an informed expert (one that
            knows where things are: the ALFWorld expert then searches nowhere first) with TASPO's privileged
            context $P_i$ in front of every prompt, as the privileged pass shows it. $P_i$ comes from the task's
            plain demonstrations, through the rule-based analyzer's Eq. 2 pipeline, as from an RL group whose
            siblings won. A small model does not follow guidance it has never seen; these rows teach it to, so
            that TASPO's Eq. 3 shifts rise on the actions $P_i$ names instead of moving with any prefix
            (`benchmarks/pi_specificity.py` measures which). Must be below `demonstrations_per_task`.
        demonstration_foreign_pi_share (`float`, defaults to `0.0`):
            Share of the plain (searching) episodes whose every prompt carries the privileged context of another
            task instead, with the plain expert's responses as targets. Informed rows teach the policy to follow
            $P_i$; these teach it to ignore guidance that quotes objects and places its task does not have, so that
            the privileged pass moves the actions its own $P_i$ names and not whatever any $P_i$ names. The other
            task is of another family where the dataset has one.
        demonstration_pi_corrections (`bool`, defaults to `False`):
            Also replay each plain (searching) episode with an informed expert following along, and make every
            turn where the informed expert would do otherwise (where the searcher heads for a place that does not
            hold the object) a row with the task's own $P_i$ in front and the informed expert's response as target:
            "go to" the place $P_i$ quotes. In an informed episode only the first move needs $P_i$ (the rest follows
            from the observation); these rows show the same states with and without $P_i$ and two different
            targets, so the target is learned from $P_i$ and not from the state. Needs
            `demonstration_pi_episodes` >= 1 (the informed episodes' $P_i$ is used) and an expert built with
            `informed=True` that can follow others' commands (`observe`).
        demonstration_thoughtless_share (`float`, defaults to `0.0`):
            Share of the rows with a privileged context in their prompt (the task's own $P_i$ or another task's;
            drawn with `demonstration_seed`) whose response has an empty thought, `<think></think>`, before the
            expert's action. A policy trained on the expert's thoughts alone settles its command in the thought
            and copies it into the action; after a thought that does not settle it (a sampled one, or the fixed
            thought of the scripted plans `benchmarks/pi_specificity.py` scores) its action tokens follow a prior
            ("go to" somewhere) and read neither the observation nor the commands $P_i$ quotes. These rows make the
            action's own tokens choose, which is where TASPO's Eq. 3 credit for the command lands. Rows without a
            context keep their thoughts, so the plain policy that plays the episodes still thinks first: with
            empty thoughts among them too, greedy decoding skipped the thought on most turns and won far less.
            Needs `demonstration_pi_episodes` >= 1.
        frozen_layers (`int`, defaults to `0`):
            Keep the token embeddings and this many of the lowest decoder layers fixed. Backpropagation then
            stops above them, so a step costs less: on the 135M embedded model, freezing 15 of its 30 layers
            makes an SFT step 1.5x faster on a CPU. The format and the moves are learned in the upper layers.
            With PEFT, the adapter's factors in those layers stay fixed at their initial (zero) update.
    """

    environment: str = field(default="alfworld", metadata={"help": "Registered environment name."})
    layout: str = field(default="turn", metadata={"help": "Prompt layout: 'turn' or 'sequence'."})
    history_window: int = field(default=3, metadata={"help": "Recent steps shown in a turn-layout prompt."})
    max_turns: int | None = field(default=None, metadata={"help": "Turn cap per episode (None: environment's)."})
    max_prompt_tokens: int | None = field(default=None, metadata={"help": "Longest prompt (None: no cap)."})
    demonstration_seed: int = field(default=0, metadata={"help": "Seed of the expert's random choices."})
    demonstrations_per_task: int = field(default=1, metadata={"help": "Expert episodes recorded per task row."})
    demonstration_mistake_rate: float = field(
        default=0.0, metadata={"help": "Per-turn probability of an injected repeat the expert recovers from."}
    )
    demonstration_wander_rate: float = field(
        default=0.0, metadata={"help": "Per-turn probability of a random command the expert recovers from."}
    )
    demonstration_stall_rate: float = field(
        default=0.0, metadata={"help": "Per-turn probability of a command that changes nothing, then the recovery."}
    )
    demonstration_pi_episodes: int = field(
        default=0, metadata={"help": "Informed expert episodes per task with the privileged context in the prompt."}
    )
    demonstration_foreign_pi_share: float = field(
        default=0.0, metadata={"help": "Share of plain episodes shown another task's privileged context."}
    )
    demonstration_pi_corrections: bool = field(
        default=False, metadata={"help": "Rows of the informed expert's corrections of plain episodes, with P_i."}
    )
    demonstration_thoughtless_share: float = field(
        default=0.0, metadata={"help": "Share of rows whose response has an empty thought."}
    )
    frozen_layers: int = field(
        default=0, metadata={"help": "Lowest decoder layers (and the embeddings) kept fixed; 0 trains all."}
    )
    completion_only_loss: bool | None = field(default=True, metadata={"help": "Loss on the responses only."})

    def __post_init__(self):
        adopt_activation_checkpointing(self)
        resolve_config_precision(self)  # before TRL's, which makes an unset bf16 True
        super().__post_init__()
        if self.demonstrations_per_task < 1:
            raise ValueError(f"demonstrations_per_task must be at least 1, got {self.demonstrations_per_task}.")
        if not 0.0 <= self.demonstration_mistake_rate < 1.0:
            raise ValueError(f"demonstration_mistake_rate must be in [0, 1), got {self.demonstration_mistake_rate}.")
        if not 0.0 <= self.demonstration_wander_rate < 1.0:
            raise ValueError(f"demonstration_wander_rate must be in [0, 1), got {self.demonstration_wander_rate}.")
        if not 0.0 <= self.demonstration_stall_rate < 1.0:
            raise ValueError(f"demonstration_stall_rate must be in [0, 1), got {self.demonstration_stall_rate}.")
        if not 0 <= self.demonstration_pi_episodes < self.demonstrations_per_task:
            raise ValueError(
                f"demonstration_pi_episodes must be at least 0 and below demonstrations_per_task="
                f"{self.demonstrations_per_task} (the privileged context comes from the task's plain episodes), got "
                f"{self.demonstration_pi_episodes}; raise demonstrations_per_task or lower it."
            )
        if not 0.0 <= self.demonstration_foreign_pi_share <= 1.0:
            raise ValueError(
                f"demonstration_foreign_pi_share must be in [0, 1], got {self.demonstration_foreign_pi_share}."
            )
        if not 0.0 <= self.demonstration_thoughtless_share <= 1.0:
            raise ValueError(
                f"demonstration_thoughtless_share must be in [0, 1], got {self.demonstration_thoughtless_share}."
            )
        if self.demonstration_thoughtless_share and not self.demonstration_pi_episodes:
            raise ValueError("demonstration_thoughtless_share empties the thoughts of rows with a privileged context; "
                             "set demonstration_pi_episodes >= 1 so that there are some.")
        if self.demonstration_foreign_pi_share and not self.demonstration_pi_episodes:
            raise ValueError("demonstration_foreign_pi_share shows plain episodes the privileged context of another "
                             "task, which informed episodes provide: set demonstration_pi_episodes >= 1.")
        if self.demonstration_pi_corrections and not self.demonstration_pi_episodes:
            raise ValueError("demonstration_pi_corrections shows plain episodes' states with the task's own privileged "
                             "context, which informed episodes provide: set demonstration_pi_episodes >= 1.")
        if self.frozen_layers < 0:
            raise ValueError(f"frozen_layers must be at least 0, got {self.frozen_layers}.")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}.")


def demonstration_sft_dataset(rows: Sequence[dict[str, Any]], tokenizer: Any, config: AgentSFTConfig) -> Any:
    """The prompt-completion dataset of the expert's winning episodes on the tasks of ``rows``: per task,
    ``demonstrations_per_task - demonstration_pi_episodes`` plain episodes, then ``demonstration_pi_episodes``
    informed ones with the privileged context their plain siblings give in every prompt, then (with
    ``demonstration_pi_corrections``) the informed expert's corrections of the plain episodes with that context."""
    from datasets import Dataset, concatenate_datasets

    specs = [task_spec_from_row(row) for row in rows]
    play = _expert_player(tokenizer, config)
    plain_per_task = config.demonstrations_per_task - config.demonstration_pi_episodes
    plain = play([spec for spec in specs for _ in range(plain_per_task)], seed=config.demonstration_seed)
    if not config.demonstration_pi_episodes:
        dataset = demonstration_dataset(plain, config.layout)
    else:
        informed, contexts = _informed_episodes(specs, config.demonstration_pi_episodes, plain, tokenizer, config)
        foreign = foreign_guidance(plain, informed, contexts, config.demonstration_foreign_pi_share,
                                   seed=config.demonstration_seed + 3)
        datasets = [_guided_rows(plain, foreign, config.layout), _guided_rows(informed, contexts, config.layout)]
        if config.demonstration_pi_corrections and (corrections := informed_corrections(plain, informed, contexts, config)):
            datasets.append(Dataset.from_list(corrections))
        dataset = concatenate_datasets(datasets)
    if config.demonstration_thoughtless_share:
        dataset = thoughtless_rows(dataset, config.demonstration_thoughtless_share, seed=config.demonstration_seed + 5)
    return dataset.select_columns(["prompt", "completion"])


def thoughtless_rows(dataset: Any, share: float, seed: int) -> Any:
    """``dataset`` (prompt-completion rows with a ``guided`` column) with a ``share`` of its guided rows, drawn with
    ``seed``, answering with an empty thought before their action
    (``AgentSFTConfig.demonstration_thoughtless_share``)."""
    import random

    rng = random.Random(seed)
    chosen = [guided and rng.random() < share for guided in dataset["guided"]]

    def empty(row: dict[str, Any], index: int) -> dict[str, Any]:
        if chosen[index]:
            row["completion"] = [{**message, "content": _THOUGHT.sub("<think></think>", message["content"], count=1)}
                                 for message in row["completion"]]
        return row

    return dataset.map(empty, with_indices=True)


def guided_sft_dataset(
    rows: Sequence[dict[str, Any]], tokenizer: Any, config: AgentSFTConfig, *, episodes_per_task: int = 1,
    sibling_episodes: int = 2,
) -> Any:
    """Only informed episodes, ``episodes_per_task`` per task of ``rows``, each with the privileged context P_i in
    every prompt; P_i comes from ``sibling_episodes`` searching episodes of the same task, played for it and not
    trained on. On tasks the policy sees nowhere else it cannot know where things are from having seen the room:
    only reading P_i tells it, which is what these rows teach."""
    specs = [task_spec_from_row(row) for row in rows]
    play = _expert_player(tokenizer, config)
    siblings = play([spec for spec in specs for _ in range(sibling_episodes)], seed=config.demonstration_seed + 2)
    informed, contexts = _informed_episodes(specs, episodes_per_task, siblings, tokenizer, config)
    return _guided_rows(informed, contexts, config.layout).select_columns(["prompt", "completion"])


def _expert_player(tokenizer: Any, config: AgentSFTConfig) -> Any:
    """``expert_demonstrations`` with the config's prompt and mistake settings."""
    return partial(
        expert_demonstrations,
        tokenizer=tokenizer,
        environment=config.environment,
        layout=config.layout,
        history_window=config.history_window,
        max_turns=config.max_turns,
        max_prompt_tokens=config.max_prompt_tokens,
        mistake_rate=config.demonstration_mistake_rate,
        wander_rate=config.demonstration_wander_rate,
        stall_rate=config.demonstration_stall_rate,
    )


def _informed_episodes(
    specs: list[dict[str, Any]], episodes_per_task: int, siblings: Sequence[Demonstration], tokenizer: Any,
    config: AgentSFTConfig,
) -> tuple[list[Demonstration], list[str]]:
    """Informed expert episodes of ``specs`` and the P_i each gets from the ``siblings`` of its task."""
    informed = _expert_player(tokenizer, config)(
        [spec for spec in specs for _ in range(episodes_per_task)], seed=config.demonstration_seed + 1, informed=True,
    )
    return informed, sibling_contexts(informed, siblings, tokenizer, config.environment)


def informed_corrections(
    plain: Sequence[Demonstration], informed: Sequence[Demonstration], contexts: Sequence[str], config: AgentSFTConfig,
) -> list[dict[str, Any]]:
    """Each plain episode relabelled by an informed expert (``relabelled_dataset`` with ``strict``: every turn where
    it would play another command is a row), with the privileged context of its task's informed episode in front of
    those rows' prompts; plain episodes of a task without a context give none."""
    own = {encode_task_prompt(d.trajectory.task_spec): c for d, c in zip(informed, contexts, strict=True) if c}
    expert_factory = partial(get_expert_factory(config.environment), informed=True)
    rows = []
    for demonstration in plain:
        context = own.get(encode_task_prompt(demonstration.trajectory.task_spec))
        if context:
            corrections = relabelled_dataset([demonstration.trajectory], environment=config.environment,
                                             expert_factory=expert_factory, layout=config.layout,
                                             seed=config.demonstration_seed + 4, strict=True)
            rows.extend(_with_context(corrections.to_list(), context))
    return rows


def _guided_rows(demonstrations: Sequence[Demonstration], contexts: Sequence[str], layout: str) -> Any:
    """The rows of ``demonstrations``, each episode's prompts with its context in front (none where it is "")."""
    from datasets import Dataset

    rows = []
    for demonstration, context in zip(demonstrations, contexts, strict=True):
        rows.extend(_with_context(demonstration_dataset([demonstration], layout).to_list(), context))
    return Dataset.from_list(rows)


def _with_context(rows: list[dict[str, Any]], context: str) -> list[dict[str, Any]]:
    """``rows`` with ``context`` in front of each prompt's first user message (none where it is ""), as
    ``privileged_prompt_ids`` puts P_i, and ``guided`` saying whether it is there."""
    for row in rows:
        row["guided"] = bool(context)
        if context:
            row["prompt"][0]["content"] = privileged_user_text(context, row["prompt"][0]["content"])
    return rows


def foreign_guidance(
    targets: Sequence[Demonstration], sources: Sequence[Demonstration], contexts: Sequence[str], share: float,
    seed: int,
) -> list[str]:
    """For a ``share`` of ``targets`` (drawn with ``seed``), a non-empty context of ``contexts`` (those of
    ``sources``) from another task, of another family where one exists; "" for the other targets."""
    import random

    rng = random.Random(seed)
    pool = [(encode_task_prompt(s.trajectory.task_spec), s.trajectory.task_type, c)
            for s, c in zip(sources, contexts, strict=True) if c]
    chosen = []
    for target in targets:
        task, family = encode_task_prompt(target.trajectory.task_spec), target.trajectory.task_type
        other_tasks = [c for t, _, c in pool if t != task]
        other_families = [c for t, f, c in pool if t != task and f != family]
        candidates = other_families or other_tasks
        chosen.append(rng.choice(candidates) if candidates and rng.random() < share else "")
    return chosen


def sibling_contexts(
    targets: Sequence[Demonstration], siblings: Sequence[Demonstration], tokenizer: Any, environment: str
) -> list[str]:
    """TASPO's privileged context P_i (Eq. 2, ``aligned`` source, rule-based analyzer with the rules of
    ``environment``, default budgets) of each target demonstration, in a group made of it and the ``siblings`` of
    the same task; "" where no sibling of its task won."""
    analyzer = RuleBasedAnalyzer(environment)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for sibling in siblings:
        by_task[encode_task_prompt(sibling.trajectory.task_spec)].append(sibling.trajectory)
    contexts = []
    for target in targets:
        group = [*by_task[encode_task_prompt(target.trajectory.task_spec)], target.trajectory]
        contexts.append(build_group_pi(group, analyzer, tokenizer).texts[-1])
    return contexts


def relabelled_sft_dataset(
    model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], config: AgentSFTConfig, *,
    episodes_per_task: int, max_turns: int, max_new_tokens: int, seed: int = 0,
) -> Any:
    """One DAgger round: ``model`` plays ``episodes_per_task`` episodes of each task of ``rows``, sampled at
    temperature 1 in the config's prompts with at most ``max_turns`` turns of ``max_new_tokens`` tokens, and the
    expert's corrections of them (``taspo_trl.rollout.demonstrations.relabelled_dataset``) are returned as
    prompt-completion rows. Trained on together with the demonstrations, they teach the policy to recover from
    the states its own mistakes lead to, which the expert's episodes never visit."""
    import torch

    torch.manual_seed(seed)
    specs = [task_spec_from_row(row) for row in rows for _ in range(episodes_per_task)]
    generator = TransformersGenerator(model, tokenizer, max_new_tokens=max_new_tokens, temperature=1.0)
    pool = EnvPool(get_env_factory(config.environment))
    try:
        trajectories = run_agent_loop(
            specs, pool, generator, ChatFormat(tokenizer), layout=config.layout,
            template=PromptTemplate(history_window=config.history_window), max_turns=max_turns,
            max_prompt_tokens=config.max_prompt_tokens,
        )
    finally:
        pool.shutdown()
    dataset = relabelled_dataset(trajectories, environment=config.environment, layout=config.layout, seed=seed)
    return dataset.select_columns(["prompt", "completion"])


@contextmanager
def _score_labelled_positions_only() -> Iterator[None]:
    """TRL's fused LM head scores only the positions that have a label when Triton is available, and every
    position elsewhere (to keep tile shapes fixed for compilers that recompile per shape). On a CPU nothing
    recompiles, and a demonstration row's label positions are its ~40 response tokens out of ~350, so the
    compact path gives the same loss and gradients for a quarter less compute (measured on the quickstart rows)."""
    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: original(device) or device.type == "cpu"
    try:
        yield
    finally:
        trl_utils._use_triton = original


def freeze_lower_layers(model: Any, count: int) -> None:
    """Fix the token embeddings and the ``count`` lowest decoder layers of a causal LM, so that the backward pass
    stops above them. The embeddings are tied to the LM head in small models, which then stays fixed too."""
    layers = model.get_decoder().layers  # a PEFT model's too: its adapter's factors in them are frozen with them
    if count > len(layers):
        raise ValueError(f"frozen_layers={count}, but the model has only {len(layers)} decoder layers.")
    model.get_input_embeddings().requires_grad_(False)
    for layer in layers[:count]:
        layer.requires_grad_(False)


class AgentSFTTrainer(AgentModelCard, SFTTrainer):
    """`trl.SFTTrainer`, called exactly like it; on a CPU its fused LM head scores only the response tokens, and
    `args.frozen_layers` fixes the lowest layers. `save_model` writes this project's model card (the Hub model the
    run started from, the environment, how to play it), as the RL trainers' does."""

    _tag_names = ["trl", "sft", "taspo-trl", "agent", "warm-start"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        frozen = getattr(self.args, "frozen_layers", 0)
        if frozen:
            freeze_lower_layers(self.model, frozen)

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        with _score_labelled_positions_only():
            return super().compute_loss(*args, **kwargs)
