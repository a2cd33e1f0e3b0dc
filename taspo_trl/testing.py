"""Helpers for tests, benchmarks and notebooks: tiny random-weight models and scripted rollouts.

- ``make_tiny_model_dir`` saves a random-weight causal LM with the embedded tokenizer: real tokenization and chat
  template, millisecond forward passes.
- ``PlannedGenerator`` replays fixed action plans but records the policy's REAL log-probs of the scripted tokens,
  so groups contain verified successes and privileged rescoring runs on genuine numbers.
- ``walkthrough_plans`` builds four sibling plans (two wins, two stalls) from a game's walkthrough.

Nothing in the training path imports this module.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import torch

from .models import EMBEDDED_MODEL
from .warmstart import resolve_policy_path
from .rollout.generation import Generation


def make_tiny_model_dir(
    out_dir: str | os.PathLike[str],
    tokenizer_source: str = EMBEDDED_MODEL,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    model_type: str = "llama",
    **config_overrides: Any,
) -> str:
    """Save a random-weight causal LM (tiny by default) with ``tokenizer_source``'s tokenizer to ``out_dir``.

    Same vocabulary and chat template as the real policy, so prompts, action spans and rollouts exercise the
    real tokenization, while a forward pass costs milliseconds. The weights depend only on ``seed``.
    ``model_type`` is a ``transformers`` architecture name (``"llama"``, ``"qwen2"``, ...); extra keyword
    arguments go to its config and win over the defaults here (``vocab_size`` defaults to the tokenizer's
    length). Returns ``out_dir`` as a string.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(resolve_policy_path(tokenizer_source))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        tie_word_embeddings=True,
    )
    config = AutoConfig.for_model(model_type, **{**settings, **config_overrides})
    # Seed a forked RNG so building a tiny model never shifts the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad_id
    )
    tokenizer.model_max_length = max_position_embeddings
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


class PlannedGenerator:
    """Answers turn c of trajectory k with ``plans[k][c]`` wrapped in the agent format.

    ``plans[k]`` is a list of actions, one per turn (``None`` = a response with no action tag). The agent loop
    calls the generator once per turn with the live trajectories in order, so at call c the live ones are those
    whose plan is longer than c: a plan must end exactly where its episode ends. Each response is scored by
    ``model`` as sampling would have recorded it: log_softmax(logits / temperature) at every response token.
    """

    def __init__(self, model: Any, tokenizer: Any, plans: list[list[str | None]], temperature: float = 1.0):
        self.model = model
        self.tokenizer = tokenizer
        self.plans = plans
        self.temperature = temperature
        self.calls = 0

    def response_text(self, action: str | None) -> str:
        if action is None:
            return "I am not sure what to do."
        return f"<think>Step {self.calls + 1}: I will do the next step.</think> <action>{action}</action>"

    def __call__(self, prompts: list[list[int]]) -> list[Generation]:
        live = [k for k, plan in enumerate(self.plans) if len(plan) > self.calls]
        if len(live) != len(prompts):
            raise RuntimeError(f"turn {self.calls}: {len(prompts)} live trajectories but {len(live)} plans continue")
        device = next(self.model.parameters()).device
        out = []
        for k, prompt in zip(live, prompts):
            ids = self.tokenizer(self.response_text(self.plans[k][self.calls]), add_special_tokens=False)["input_ids"]
            ids = ids + [self.tokenizer.eos_token_id]
            with torch.no_grad():  # only the logits that predict the response: the LM head dominates otherwise
                sequence = torch.tensor([prompt + ids], device=device)
                logits = self.model(sequence, logits_to_keep=len(ids) + 1).logits[0, :-1]
            logprobs = torch.log_softmax(logits.float() / self.temperature, -1)
            out.append(Generation(ids, logprobs.gather(1, torch.tensor(ids, device=device)[:, None]).squeeze(1).tolist(), True))
        self.calls += 1
        return out


def walkthrough_plans(walkthrough: list[str], max_turns: int, wins: int = 2) -> list[list[str | None]]:
    """Four sibling plans for one game: ``wins`` of them reach the goal (the walkthrough, then the walkthrough
    with a detour), the others stall until ``max_turns`` (a partial attempt with a malformed turn, an attempt
    that never opens the goal receptacle, only malformed turns, only ``inventory``)."""
    if len(walkthrough) + 1 > max_turns:
        raise ValueError(f"max_turns={max_turns} is too short for a {len(walkthrough)}-step walkthrough with a detour")
    winning = [list(walkthrough), walkthrough[:1] + ["look"] + walkthrough[1:]]
    failing: list[list[str | None]] = [
        (walkthrough[:2] + [None, "look", "inventory"] + ["look"] * max_turns)[:max_turns],
        (["look", walkthrough[0], None, "inventory"] + ["look"] * max_turns)[:max_turns],
        [None] * max_turns,
        ["inventory"] * max_turns,
    ]
    return (winning[:wins] + failing)[:4]


def noisy_oracle_plan(env_name: str, spec: dict[str, Any], rng: random.Random, epsilon: float) -> list[str]:
    """The actions of one episode of ``spec`` played by the environment's oracle with noise: at every turn, with
    probability ``epsilon``, a random action instead (WebShop: a random clickable of the page, or a search for
    random words of the instruction; Search-QA: a search for random words of the question, or one of them as the
    answer, which does not advance the oracle's plan). Played on a fresh environment, so every action is one the
    episode could take; groups of such siblings mix successes and failures as sampled groups do."""
    from .envs import get_env_factory

    env = get_env_factory(env_name)(spec)
    env.reset()
    if env_name == "webshop":
        from .envs.webshop import OraclePolicy
        from .envs.webshop.env import SEARCH_COMMAND

        oracle, words = OraclePolicy(env.goal), env.task.split()

        def act() -> str:
            if rng.random() >= epsilon:
                return oracle(env.admissible_commands)
            action = rng.choice(env.admissible_commands)
            return f"search[{' '.join(rng.sample(words, min(3, len(words))))}]" if action == SEARCH_COMMAND else action
    elif env_name == "search":
        from .envs.search import oracle_actions

        plan, words, done = oracle_actions(spec), re.findall(r"\w+", spec["question"]), [0]

        def act() -> str:
            if rng.random() < epsilon:
                query = " ".join(rng.sample(words, min(2, len(words))))
                return rng.choice([f"<search>{query}</search>", f"<answer>{rng.choice(words)}</answer>"])
            done[0] += 1
            return plan[min(done[0] - 1, len(plan) - 1)]
    else:
        raise ValueError(f"no noisy oracle for environment {env_name!r} (webshop or search)")
    actions = []
    while True:
        actions.append(act())
        if env.step(actions[-1]).done:
            return actions
