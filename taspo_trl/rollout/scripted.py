"""A generator that replays fixed action plans but records the policy's REAL log-probs of the scripted tokens.

Used for oracle/scripted rollouts (walkthrough-following siblings) in tests, benchmarks and demonstrations:
groups then contain verified successes, so privileged information and rescoring run on genuine numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from .generation import Generation


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
