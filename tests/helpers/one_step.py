"""One real optimizer step on a scripted ALFWorld batch, and what TRL's loss received: the helpers shared by the
tests that check a method's credit reaches the loss (``tests/trainers/test_credit_reaches_loss.py``,
``tests/trainers/test_alignopsd_reaches_loss.py``).

The batch: four siblings on one pick_and_place_simple game (the ``pick_and_place_game`` fixture; two wins, two
failures, ``scripted_plans``) played by ``ThinkingGenerator``, whose reasoning names the action it takes.
``train_one_step`` runs the step and records every ``compute_loss`` input; ``received_rows`` turns those into one
(key, advantages, loss weights) row per completion; ``chat_prompt_ids`` and ``response_logprobs`` are the
independent forwards the expectations are built from."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch

import taspo_trl.trainers.grpo as grpo_module
from taspo_trl.testing import PlannedGenerator

MAX_TURNS = 6  # the trainers' turn limit in these tests; the longest scripted plan has 6 actions
ATOL = 1e-4  # float32 forwards in different batch shapes agree to ~1e-5 in log-prob; weights amplify by < 2

THOUGHTS = {
    "go to": "The cd could be at {rest}, so I walk over there.",
    "open": "The {rest} is closed; opening it shows what is inside.",
    "take": "There it is, I pick up {rest}.",
    "move": "I hold the cd, and {rest} is where it belongs.",
    "look": "I am not sure where I am; I look around first.",
    "inventory": "Let me check what I am carrying.",
    "examine": "I want a closer view of {rest}.",
}


class ThinkingGenerator(PlannedGenerator):
    """``PlannedGenerator`` whose reasoning follows the action it is about to take, so two siblings that decide
    differently also think differently (and two that decide alike think alike)."""

    def response_text(self, action: str | None) -> str:
        if action is None:
            return "I am not sure what to do."
        verb = next(v for v in THOUGHTS if action.startswith(v))
        thought = THOUGHTS[verb].format(rest=action[len(verb) :].strip())
        return f"<think>{thought}</think> <action>{action}</action>"


def scripted_plans(walkthrough: list[str]) -> list[list[str | None]]:
    """Two wins (the walkthrough; the walkthrough with a look around), two failures: one that finds and takes the
    cd but carries it to the wrong place, and one that wanders and never opens the drawer."""
    go_drawer, open_drawer, take_cd, go_bin, put_cd = walkthrough
    return [
        [go_drawer, open_drawer, take_cd, go_bin, put_cd],
        [go_drawer, "look", open_drawer, take_cd, go_bin, put_cd],
        [go_drawer, open_drawer, take_cd, "go to countertop 1", "inventory", None],
        ["look", "go to countertop 1", "examine countertop 1", "inventory", "go to drawer 1", "look"],
    ]


def train_one_step(trainer, game, monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Run ``trainer.train()`` for its one step on the scripted batch; returns the inputs of every
    ``compute_loss`` call, copied before the loss sees them."""
    plans = scripted_plans(json.loads(Path(game).read_text())["walkthrough"])
    generator = ThinkingGenerator(trainer.model, trainer.processing_class, plans)
    monkeypatch.setattr(grpo_module, "generator_for_trainer", lambda _trainer, batch_size=None: generator)
    seen: list[dict[str, torch.Tensor]] = []
    compute_loss = type(trainer).compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "tool_mask")
        seen.append({key: inputs[key].detach().clone() for key in keys})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(type(trainer), "compute_loss", spy)
    try:
        trainer.train()
    finally:
        trainer.close()
    assert seen, "compute_loss was never called"
    return seen


def received_rows(seen: list[dict[str, torch.Tensor]]) -> list[tuple[tuple, torch.Tensor, torch.Tensor]]:
    """(row key, advantages, loss weights) of every row TRL's loss got: the key is the row's unpadded prompt and
    completion token ids, the values are on its completion tokens."""
    out = []
    for inputs in seen:
        for r in range(inputs["completion_ids"].size(0)):
            completion = inputs["completion_mask"][r].bool()
            if not completion.any():
                continue  # layout padding
            prompt = inputs["prompt_ids"][r][inputs["prompt_mask"][r].bool()].tolist()
            key = (tuple(prompt), tuple(inputs["completion_ids"][r][completion].tolist()))
            out.append((key, inputs["advantages"][r][completion].double(), inputs["tool_mask"][r][completion].double()))
    return out


def chat_prompt_ids(tokenizer, user_text: str) -> list[int]:
    """``user_text`` as one user message in the tokenizer's chat template, with the generation prompt."""
    messages = [{"role": "user", "content": user_text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


_LOGPROBS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, torch.Tensor]]" = weakref.WeakKeyDictionary()
"""Per model object (not its ``id``, which a later model may reuse once this one is freed)."""


def response_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(response | prompt) token by token (float64), from one plain forward (kept: the forwards of one step
    are reused by several expectations, so score a model only once its weights no longer change)."""
    kept = _LOGPROBS.setdefault(model, {})
    key = (tuple(prompt), tuple(response))
    if key not in kept:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response]), logits_to_keep=len(response) + 1).logits[0, :-1]
        kept[key] = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
    return kept[key]
