"""Expert demonstrations: every one wins when replayed in a fresh real environment, its prompts are token for
token what the agent loop shows the policy (both layouts), its thoughts are not the action restated, and the
dataset is TRL's conversational prompt-completion format."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.envs import get_env_factory, get_expert_factory
from taspo_trl.envs.alfworld import generate_games, task_spec_rows
from taspo_trl.envs.alfworld.generator import may_hold
from taspo_trl.envs.base import task_spec_from_row
from taspo_trl.envs.search import search_task_rows
from taspo_trl.envs.webshop import webshop_task_rows
from taspo_trl.rollout.demonstrations import (
    demonstration_dataset,
    expert_demonstrations,
    play_expert,
    relabelled_dataset,
)

_BLOCK = re.compile(r"^<think>(?P<thought>.+)</think> (?P<block><(?P<tag>action|search|answer)>(?P<action>.*)</(?P=tag)>)$", re.S)


@pytest.fixture(scope="module")
def alfworld_specs(tmp_path_factory):
    games = generate_games(tmp_path_factory.mktemp("demo_games"), per_type=1, seed=3, split="train")
    return [task_spec_from_row(row) for row in task_spec_rows(games)]


def _replay_wins(environment: str, spec: dict, actions: list[str]) -> bool:
    """Plays ``actions`` in a fresh environment of ``spec``, independently of the demonstration code."""
    env = get_env_factory(environment)(dict(spec))
    try:
        env.reset()
        result = None
        for action in actions:
            result = env.step(action)
        return bool(result is not None and result.done and result.info.get("won"))
    finally:
        env.close()


def _actions(trajectory, multi_tag: bool) -> list[str]:
    return [_BLOCK.match(turn.response_text)["block" if multi_tag else "action"] for turn in trajectory.turns]


@pytest.mark.parametrize(
    "layout,window", [("turn", 1), pytest.param("turn", 3, marks=pytest.mark.slow), ("sequence", 3)]  # slow: 30 s
)
def test_alfworld_demonstrations_win_and_match_the_loop_prompts(alfworld_specs, embedded_tokenizer, layout, window):
    demonstrations = expert_demonstrations(
        alfworld_specs, embedded_tokenizer, environment="alfworld", layout=layout, history_window=window
    )
    assert len(demonstrations) == len(alfworld_specs) == 6  # the expert wins every generated game
    assert all(not d.mistakes for d in demonstrations)  # none injected unless asked for
    trajectories = [d.trajectory for d in demonstrations]
    dataset = demonstration_dataset(demonstrations, layout)
    assert len(dataset) == sum(len(t.turns) for t in trajectories)
    row = 0
    for spec, trajectory in zip(alfworld_specs, trajectories, strict=True):
        assert _replay_wins("alfworld", spec, _actions(trajectory, multi_tag=False))
        for turn in trajectory.turns:
            example = dataset[row]
            row += 1
            # TRL renders a conversational prompt with the chat template and a generation prompt: those must be
            # exactly the ids the policy is conditioned on during rollouts.
            rendered = embedded_tokenizer.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=False)
            assert embedded_tokenizer(rendered, add_special_tokens=False)["input_ids"] == turn.prompt_ids
            assert example["completion"] == [{"role": "assistant", "content": turn.response_text}]
            assert example["prompt"][-1]["role"] == "user"
            if layout == "turn":
                assert len(example["prompt"]) == 1
            else:  # the whole conversation so far: user and assistant messages alternate
                assert [m["role"] for m in example["prompt"]] == ["user", "assistant"] * (len(example["prompt"]) // 2) + ["user"]


@pytest.fixture(scope="module")
def mistaken_demonstrations(alfworld_specs, embedded_tokenizer):
    """Expert episodes of every game with injected repeats (mistake rate 0.4), shared by the tests below."""
    return expert_demonstrations(
        alfworld_specs, embedded_tokenizer, environment="alfworld", history_window=1, mistake_rate=0.4, seed=1
    )


def test_alfworld_thoughts_explain_rather_than_repeat(mistaken_demonstrations):
    """The expert's own turns (the injected repeats left out)."""
    thoughts = []
    for trajectory, mistakes in mistaken_demonstrations:
        task_words = set(re.findall(r"[a-z]+", trajectory.task.lower())) - {"a", "some", "it", "in", "on", "put", "and", "the", "with", "then"}
        turns = [turn for t, turn in enumerate(trajectory.turns) if t not in mistakes]
        for turn in turns:
            match = _BLOCK.match(turn.response_text)
            assert match, turn.response_text
            thought, action = match["thought"], match["action"]
            assert thought.strip() and thought.strip().rstrip(".") != action
            assert not thought.startswith(action)
            thoughts.append(thought)
        # Each episode's reasoning refers to its own task (the object or the place it names).
        joined = " ".join(_BLOCK.match(t.response_text)["thought"].lower() for t in turns)
        assert any(word in joined for word in task_words), (trajectory.task, joined)
    # Varied wording: far more distinct sentences than there are situations, none dominating.
    assert len(set(thoughts)) >= 0.8 * len(thoughts)


def test_thought_wording_follows_the_seed(alfworld_specs, embedded_tokenizer):
    spec = alfworld_specs[0]
    env_factory, expert = get_env_factory("alfworld"), get_expert_factory("alfworld")
    first = play_expert(spec, env_factory, expert, random.Random(0))
    again = play_expert(spec, env_factory, expert, random.Random(0))
    assert first.won and first == again
    others = {tuple(play_expert(spec, env_factory, expert, random.Random(s)).responses) for s in range(1, 6)}
    assert len(others | {tuple(first.responses)}) > 1


def test_webshop_and_search_demonstrations_win(embedded_tokenizer):
    for environment, rows in (
        ("webshop", webshop_task_rows(split="train", max_tasks=4)),
        ("search", search_task_rows(split="train", max_tasks=6)),
    ):
        specs = [task_spec_from_row(row) for row in rows]
        demonstrations = expert_demonstrations(specs, embedded_tokenizer, environment=environment, history_window=1)
        assert demonstrations, environment
        by_task = {spec["task"]: spec for spec in specs}
        for trajectory, _ in demonstrations:
            assert trajectory.won
            spec = by_task[trajectory.task]
            assert _replay_wins(environment, spec, _actions(trajectory, multi_tag=environment == "search"))


def test_a_task_the_expert_cannot_finish_is_left_out(alfworld_specs, embedded_tokenizer, caplog):
    short = [dict(spec, max_turns=2) for spec in alfworld_specs[:2]]  # every walkthrough needs 4 or more steps
    with pytest.raises(ValueError, match="won none"):
        expert_demonstrations(short, embedded_tokenizer, environment="alfworld")
    kept = expert_demonstrations([short[0], alfworld_specs[1]], embedded_tokenizer, environment="alfworld")
    assert [d.trajectory.task for d in kept] == [alfworld_specs[1]["task"]]
    assert "did not win" in caplog.text


def test_an_environment_without_an_expert_is_named():
    with pytest.raises(ValueError, match="register_expert"):
        get_expert_factory("no-such-env")


def test_alfworld_expert_searches_before_it_finds(alfworld_specs):
    """Over many seeds the expert visits receptacles that do not hold the object, says so, moves on, and still
    wins; with no detour drawn it plays the planner's walkthrough command for command."""
    env_factory, expert = get_env_factory("alfworld"), get_expert_factory("alfworld")
    spec = next(s for s in alfworld_specs if s["task_type"] == "pick_clean_then_place_in_recep")
    env = env_factory(dict(spec))
    env.reset()
    walkthrough = list(env.walkthrough)
    env.close()
    kind = next(a.split()[1] for a in walkthrough if a.startswith("take "))
    lengths, saw_miss = set(), False
    for seed in range(12):
        responses, won, _ = play_expert(spec, env_factory, expert, random.Random(seed))
        assert won, (seed, responses)
        actions = [_BLOCK.match(r)["action"] for r in responses]
        lengths.add(len(actions))
        if len(actions) == len(walkthrough):
            assert actions == walkthrough
        else:
            # Every extra step is part of a search: going somewhere else first, or opening what is there.
            assert len(actions) > len(walkthrough)
            assert all(a.startswith(("go to ", "open ")) for a in actions[: len(actions) - len(walkthrough) + 1])
            saw_miss |= any(_BLOCK.match(r)["thought"].startswith(f"Is a {kind} here? No") for r in responses)
            detours = {a[len("go to "):] for a in actions if a.startswith("go to ")} - {
                a[len("go to "):] for a in walkthrough if a.startswith("go to ")}
            assert detours and all(may_hold(r, kind) for r in detours), (kind, detours)
    assert min(lengths) == len(walkthrough) and max(lengths) > len(walkthrough) and saw_miss


def test_may_hold_knows_how_alfworld_rooms_are_furnished():
    """Facts about ALFWorld's placements, checked by hand against its object lists."""
    assert may_hold("fridge 1", "tomato") and may_hold("drawer 12", "cd") and may_hold("bed 1", "pillow")
    assert may_hold("countertop 2", "apple") and may_hold("sinkbasin 1", "soapbar")
    assert not may_hold("toilet 1", "apple") and not may_hold("microwave 1", "cd") and not may_hold("bed 1", "egg")
    assert not may_hold("fridge 1", "unknownthing")


def test_injected_mistakes_are_recovered_from_and_not_trained_on(alfworld_specs, mistaken_demonstrations):
    """A mistake repeats the previous command, which the game mostly answers with "Nothing happens."; the episode
    still wins, the mistake gets no dataset row, and the next row's prompt shows the failed repeat."""
    demonstrations = mistaken_demonstrations
    assert len(demonstrations) == len(alfworld_specs)
    dataset = demonstration_dataset(demonstrations, "turn")
    assert len(dataset) == sum(len(d.trajectory.turns) - len(d.mistakes) for d in demonstrations)
    assert sum(len(d.mistakes) for d in demonstrations) >= 6
    completions = [row["completion"][0]["content"] for row in dataset]
    prompts = [row["prompt"][0]["content"] for row in dataset]
    for trajectory, mistakes in demonstrations:
        assert trajectory.won and 0 not in mistakes
        assert _replay_wins("alfworld", trajectory.task_spec, _actions(trajectory, multi_tag=False))
        for t in mistakes:
            mistake, before = trajectory.turns[t], trajectory.turns[t - 1]
            assert t - 1 not in mistakes and mistake.action == before.action
            # Most repeats do nothing; treating an object twice just treats it again.
            assert mistake.observation.strip() == "Nothing happens." or mistake.action.startswith(("clean", "heat", "cool"))
            after = trajectory.turns[t + 1]  # an episode never ends on a repeat: the expert has to win it
            assert after.response_text in completions
            assert after.prompt_text in prompts and mistake.observation in after.prompt_text
            assert mistake.prompt_text not in prompts  # nor is the mistake's own turn a training example


def _finish_with_expert(spec: dict, first: Callable[[int, list[str]], str | None], rng: random.Random):
    """Plays ``first(turn, admissible)`` while it gives a command, with the expert following along (asked every
    turn, as relabelling asks it), then the expert alone; returns the episode's (commands, won)."""
    env = get_env_factory("alfworld")(dict(spec))
    try:
        observation = env.reset()
        expert = get_expert_factory("alfworld")(spec, env)
        commands = []
        for turn in range(50):
            admissible = list(env.admissible_commands)
            _, suggested = expert(observation, admissible, rng)
            command = first(turn, admissible) or suggested
            result = env.step(command)
            expert.observe(command, admissible)
            commands.append(command)
            observation = result.observation
            if result.done:
                return commands, bool(result.info["won"])
        return commands, False
    finally:
        env.close()


@settings(max_examples=18, deadline=None, derandomize=True)
@given(game=st.integers(0, 5), prefix_length=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_the_alfworld_expert_recovers_from_any_random_start(alfworld_specs, game, prefix_length, seed):
    """Whatever an agent did first (walked anywhere, took the wrong thing, put the right one down elsewhere, closed
    what it opened), the expert that followed along finishes the task from there: what relabelling relies on."""
    rng = random.Random(seed)
    commands, won = _finish_with_expert(
        alfworld_specs[game], lambda turn, admissible: rng.choice(admissible) if turn < prefix_length else None, rng
    )
    assert won, commands


def test_relabelling_corrects_every_injected_mistake(mistaken_demonstrations):
    """Relabelling episodes with injected mistakes (repeats the game answers with "Nothing happens.") gives a row
    at every mistake, with the mistake's own prompt and a different command, from which the expert wins; the
    other rows are places where the relabelling expert chose another search than the demonstrating one."""
    demonstrations = mistaken_demonstrations
    rows = relabelled_dataset([d.trajectory for d in demonstrations], environment="alfworld", seed=5)
    assert set(rows.column_names) == {"prompt", "completion", "task_type", "turn"}
    by_prompt = {row["prompt"][0]["content"]: row for row in rows}
    for trajectory, mistakes in demonstrations:
        for t in mistakes:
            row = by_prompt[trajectory.turns[t].prompt_text]
            assert row["turn"] == t and row["prompt"] == [{"role": "user", "content": trajectory.turns[t].prompt_text}]
            correction = _BLOCK.match(row["completion"][0]["content"])["action"]
            assert correction != trajectory.turns[t].action
            # From the mistake's state, the correction and then the expert alone win the game.
            plan = [turn.action for turn in trajectory.turns[:t]] + [correction]
            commands, won = _finish_with_expert(
                trajectory.task_spec, lambda turn, _: plan[turn] if turn < len(plan) else None, random.Random(0)
            )
            assert won, (trajectory.task, commands)
    assert sum(len(d.mistakes) for d in demonstrations) <= len(rows)


def test_relabelling_needs_an_expert_that_can_follow(embedded_tokenizer):
    rows = search_task_rows(split="train", max_tasks=1)
    specs = [task_spec_from_row(row) for row in rows]
    demonstrations = expert_demonstrations(specs, embedded_tokenizer, environment="search", history_window=1)
    with pytest.raises(ValueError, match="observe"):
        relabelled_dataset([d.trajectory for d in demonstrations], environment="search")


@pytest.mark.parametrize("rate", ["wander_rate", "stall_rate"])
def test_injected_commands_are_recovered_from_and_not_trained_on(alfworld_specs, embedded_tokenizer, rate):
    """With wander_rate, episodes also play random admissible commands (wrong places, wrong objects); with
    stall_rate, ALFWorld's commands that change nothing (look, inventory). The expert follows them and still wins
    every game, no injected command becomes a training row, and the next turn's prompt shows it as the last step."""
    specs = alfworld_specs[:3]
    demonstrations = expert_demonstrations(
        specs, embedded_tokenizer, environment="alfworld", history_window=1, seed=2, **{rate: 0.3}
    )
    assert len(demonstrations) == len(specs)
    assert sum(len(d.mistakes) for d in demonstrations) >= 3
    dataset = demonstration_dataset(demonstrations, "turn")
    assert len(dataset) == sum(len(d.trajectory.turns) - len(d.mistakes) for d in demonstrations)
    completions = {row["completion"][0]["content"] for row in dataset}
    for trajectory, mistakes in demonstrations:
        actions = _actions(trajectory, multi_tag=False)
        assert _replay_wins("alfworld", trajectory.task_spec, actions)
        assert all(trajectory.turns[t].response_text not in completions for t in mistakes)
        assert all(f"Action: {actions[t]}\n" in trajectory.turns[t + 1].prompt_text for t in mistakes)
        if rate == "stall_rate":
            assert all(actions[t] in ("look", "inventory") for t in mistakes)


def test_stalls_need_an_environment_with_commands_that_change_nothing(embedded_tokenizer):
    specs = [task_spec_from_row(row) for row in search_task_rows(split="train", max_tasks=1)]
    with pytest.raises(ValueError, match="stall_commands"):
        expert_demonstrations(specs, embedded_tokenizer, environment="search", history_window=1, stall_rate=0.2)


def test_an_informed_alfworld_expert_plays_the_planners_walkthrough(alfworld_specs):
    """Told where things are, the expert searches nowhere first: at any seed, in every family, its commands are
    the planner's walkthrough stored in the game, command for command, up to which instance of the wanted kind it
    takes where several lie together (ALFWorld goals name kinds)."""
    def kinds(actions: list[str]) -> list[str]:
        return [re.sub(r" \d+ (from|to|with) ", r" \1 ", a) for a in actions]

    env_factory, expert = get_env_factory("alfworld"), get_expert_factory("alfworld")
    for spec in alfworld_specs:
        env = env_factory(dict(spec))
        env.reset()
        walkthrough = list(env.walkthrough)
        env.close()
        for seed in range(4):
            responses, won, _ = play_expert(spec, env_factory, expert, random.Random(seed), informed=True)
            played = [_BLOCK.match(r)["action"] for r in responses]
            assert won and kinds(played) == kinds(walkthrough), (spec["task_type"], seed, played, walkthrough)


def test_informed_episodes_carry_their_siblings_privileged_context(alfworld_specs, embedded_tokenizer, tmp_path):
    """demonstration_pi_episodes: the plain episodes are those of a run without it, row for row; each informed
    episode's rows have TASPO's P_i in front of the user message, exactly as the privileged pass puts it, and P_i
    quotes the commands the informed expert then plays (it was built from siblings that played them too)."""
    from taspo_trl.trainers.sft import AgentSFTConfig, demonstration_sft_dataset

    rows = [dict(spec) for spec in alfworld_specs[:3]]
    settings = dict(output_dir=str(tmp_path), history_window=1, demonstration_mistake_rate=0.15, use_cpu=True,
                    report_to="none")
    plain = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(**settings, demonstrations_per_task=2))
    mixed = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(
        **settings, demonstrations_per_task=3, demonstration_pi_episodes=1))
    assert mixed.to_list()[: len(plain)] == plain.to_list()
    guided = mixed.to_list()[len(plain):]
    assert guided
    with_pi = [row for row in guided if row["prompt"][0]["content"].startswith("[Privileged Guidance]")]
    assert len(with_pi) >= len(guided) // 2
    for row in with_pi:
        context, user = row["prompt"][0]["content"].split("[End Privileged Guidance]\n\n")
        assert user.startswith("You are an expert agent") and "[Privileged" not in user
        action = _BLOCK.match(row["completion"][0]["content"])["action"]
        if action.startswith(("take ", "move ", "use ", "clean ", "heat ", "cool ")):
            assert f'"{action}"' in context, (action, context)
    with pytest.raises(ValueError, match="demonstration_pi_episodes must be at least 0 and below"):
        AgentSFTConfig(**settings, demonstrations_per_task=2, demonstration_pi_episodes=2)


def test_guided_rows_hold_informed_episodes_only(alfworld_specs, embedded_tokenizer, tmp_path):
    """guided_sft_dataset: one row per turn of the informed episodes (the walkthrough's length, injected repeats
    left out), none from the searching siblings that P_i was built from; every row that has P_i has it in front."""
    from taspo_trl.trainers.sft import AgentSFTConfig, guided_sft_dataset

    specs = [s for s in alfworld_specs if s["task_type"] in ("pick_and_place_simple", "look_at_obj_in_light")]
    config = AgentSFTConfig(output_dir=str(tmp_path), history_window=1, use_cpu=True, report_to="none")
    rows = guided_sft_dataset([dict(s) for s in specs], embedded_tokenizer, config).to_list()
    walkthroughs = 0
    for spec in specs:
        env = get_env_factory("alfworld")(dict(spec))
        env.reset()
        walkthroughs += len(env.walkthrough)
        env.close()
    assert len(rows) == walkthroughs
    contexts = [r["prompt"][0]["content"] for r in rows if r["prompt"][0]["content"].startswith("[Privileged Guidance]")]
    assert contexts and all("[End Privileged Guidance]\n\nYou are an expert agent" in c for c in contexts)


def test_foreign_guidance_rows_keep_the_plain_experts_targets(alfworld_specs, embedded_tokenizer, tmp_path):
    """demonstration_foreign_pi_share: the plain episodes' rows are those of a run without it, target for target
    and prompt for prompt, but with another task's P_i in front (one of the informed episodes' contexts, from a
    task of another family), so that the policy learns to act as if no guidance were there."""
    from taspo_trl.trainers.sft import AgentSFTConfig, demonstration_sft_dataset

    rows = [dict(spec) for spec in alfworld_specs[:3]]
    settings = dict(output_dir=str(tmp_path), history_window=1, use_cpu=True, report_to="none",
                    demonstrations_per_task=2, demonstration_pi_episodes=1)
    own = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(**settings)).to_list()
    foreign = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(
        **settings, demonstration_foreign_pi_share=1.0)).to_list()
    assert len(own) == len(foreign)
    marker = "[End Privileged Guidance]\n\n"
    informed_contexts = {}
    for row in own:
        if marker in row["prompt"][0]["content"]:
            context, user = row["prompt"][0]["content"].split(marker)
            informed_contexts[context] = user.split("Your task is: ")[1].split("\n")[0]
    plain_rows = [i for i, row in enumerate(own) if marker not in row["prompt"][0]["content"]]
    assert plain_rows and informed_contexts
    shown = 0
    for i in plain_rows:
        assert foreign[i]["completion"] == own[i]["completion"]
        content = foreign[i]["prompt"][0]["content"]
        if marker not in content:
            continue
        shown += 1
        context, user = content.split(marker)
        assert user == own[i]["prompt"][0]["content"]
        task = user.split("Your task is: ")[1].split("\n")[0]
        assert context in informed_contexts and informed_contexts[context] != task
    assert shown == len(plain_rows)  # share 1: every plain row, as every task has another family's context
    assert [r for r in foreign if r not in [foreign[i] for i in plain_rows]] == [own[i] for i in range(len(own))
                                                                                  if i not in plain_rows]
    with pytest.raises(ValueError, match="set demonstration_pi_episodes >= 1"):
        AgentSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", demonstration_foreign_pi_share=0.5)


def test_informed_corrections_send_the_searcher_where_its_own_guidance_points(alfworld_specs, embedded_tokenizer,
                                                                             tmp_path):
    """demonstration_pi_corrections: the other rows stay as they were; one row more for every move of a searching
    episode to a place the planner's walkthrough never visits (a detour), with the task's own P_i in front and, as
    target, "go to" the place the walkthrough takes the object from, a command that P_i quotes."""
    from taspo_trl.trainers.sft import AgentSFTConfig, demonstration_sft_dataset

    rows = [dict(spec) for spec in alfworld_specs[:4]]
    settings = dict(output_dir=str(tmp_path), history_window=1, use_cpu=True, report_to="none",
                    demonstrations_per_task=2, demonstration_pi_episodes=1)
    before = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(**settings)).to_list()
    after = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(
        **settings, demonstration_pi_corrections=True)).to_list()
    assert after[: len(before)] == before
    added = after[len(before):]

    marker = "[End Privileged Guidance]\n\n"
    walkthrough_places, sources, own_context = {}, {}, {}
    for spec in rows:
        env = get_env_factory("alfworld")(dict(spec))
        env.reset()
        task = env.task.rstrip(". ")
        walkthrough_places[task] = {c.removeprefix("go to ") for c in env.walkthrough if c.startswith("go to ")}
        sources[task] = {re.match(r"take .+ from (.+)$", c)[1] for c in env.walkthrough if c.startswith("take ")}
        env.close()

    def task_of(user: str) -> str:
        return user.split("Your task is: ")[1].split("\n")[0].rstrip(". ")

    detours = 0
    for row in before:
        content = row["prompt"][0]["content"]
        if marker in content:
            context, user = content.split(marker)
            own_context[task_of(user)] = context
            continue
        action = _BLOCK.match(row["completion"][0]["content"])["action"]
        detours += action.startswith("go to ") and action.removeprefix("go to ") not in walkthrough_places[task_of(content)]
    assert detours > 0 and len(added) == detours
    for row in added:
        context, user = row["prompt"][0]["content"].split(marker)
        task = task_of(user)
        assert context == own_context[task]
        action = _BLOCK.match(row["completion"][0]["content"])["action"]
        assert action.removeprefix("go to ") in sources[task] and f'"{action}"' in context, (action, context)
    with pytest.raises(ValueError, match="set demonstration_pi_episodes >= 1"):
        AgentSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", demonstration_pi_corrections=True)


def test_thoughtless_rows_are_guided_rows_with_the_same_action_and_no_thought(alfworld_specs, embedded_tokenizer,
                                                                              tmp_path):
    """demonstration_thoughtless_share: the chosen rows all carry a privileged context and answer ``<think></think>``
    with the same action; prompts, rows without a context and the other rows stay as they were, and the choice
    follows the seed."""
    from taspo_trl.trainers.sft import AgentSFTConfig, demonstration_sft_dataset

    rows = [dict(spec) for spec in alfworld_specs[:2]]
    settings = dict(output_dir=str(tmp_path), history_window=1, use_cpu=True, report_to="none",
                    demonstrations_per_task=2, demonstration_pi_episodes=1)
    plain = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(**settings)).to_list()
    every = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(
        **settings, demonstration_thoughtless_share=1.0)).to_list()
    half = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(
        **settings, demonstration_thoughtless_share=0.5)).to_list()
    again = demonstration_sft_dataset(rows, embedded_tokenizer, AgentSFTConfig(
        **settings, demonstration_thoughtless_share=0.5)).to_list()
    assert [r["prompt"] for r in every] == [r["prompt"] for r in plain] == [r["prompt"] for r in half]
    guided_rows = 0
    for before, after, some in zip(plain, every, half, strict=True):
        action = _BLOCK.match(before["completion"][0]["content"])["action"]
        if before["prompt"][0]["content"].startswith("[Privileged Guidance]"):
            guided_rows += 1
            assert after["completion"][0]["content"] == f"<think></think> <action>{action}</action>"
        else:
            assert after["completion"] == before["completion"]
        assert some["completion"] in (before["completion"], after["completion"])
    assert 0 < guided_rows < len(plain)
    changed = sum(a["completion"] != b["completion"] for a, b in zip(half, plain, strict=True))
    assert 0 < changed < guided_rows and half == again
    with pytest.raises(ValueError, match="demonstration_thoughtless_share must be in"):
        AgentSFTConfig(**settings, demonstration_thoughtless_share=1.5)
    with pytest.raises(ValueError, match="set demonstration_pi_episodes >= 1"):
        AgentSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", demonstration_thoughtless_share=0.5)
