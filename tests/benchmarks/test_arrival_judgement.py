"""``benchmarks/arrival_judgement.py``: its arrival turns are the ones where the object is in view or not, its
decision score is the policy's log-probability of the answer after the thought's question, and its AUC counts
pairs by hand."""

from __future__ import annotations

import re

import pytest


@pytest.fixture(scope="module")
def arrival_judgement(load_benchmark):
    return load_benchmark("arrival_judgement")


@pytest.fixture(scope="module")
def arrivals(arrival_judgement, embedded_tokenizer, tmp_path_factory):
    from taspo_trl.envs.alfworld import generate_games, task_spec_rows

    root = tmp_path_factory.mktemp("arrivals")
    rows = task_spec_rows(generate_games(root / "games", 1, 0, "train", task_types=["pick_and_place_simple"]))
    return arrival_judgement.arrival_rows(rows, embedded_tokenizer, root)


def _current_view(prompt: list[dict]) -> tuple[str, str]:
    """(the task's object kind, what the current observation and its admissible commands show)."""
    text = prompt[-1]["content"]
    kind = re.search(r"Your task is: put (?:a|an|some) (\w+) (?:in|on) ", text)[1]
    return kind, text[text.index("Current observation"):]


def test_yes_turns_show_the_object_and_no_turns_do_not(arrivals):
    decisions = [decision for *_, decision in arrivals]
    assert "Yes" in decisions and "No" in decisions
    for prompt, question, decision in arrivals:
        kind, view = _current_view(prompt)
        assert question == f"Is a {kind} here?"
        can_take = re.search(rf"'take {kind} \d+ from ", view) is not None
        assert can_take == (decision == "Yes"), (decision, view)


def test_decision_score_is_the_log_probability_of_the_answer_after_the_question(arrival_judgement, arrivals,
                                                                                tiny_model_dir, one_torch_thread):
    import torch

    from taspo_trl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    prompt, question, _ = arrivals[0]
    scores = arrival_judgement.decision_logprobs(model, tokenizer, prompt, question)
    # Independently: one forward pass over the context alone, and the next-token distribution at its end, for
    # each answer that the tokenizer writes as one token after the question.
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) + "<think>" + question
    context = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        next_token = model(torch.tensor([context])).logits[0, -1].log_softmax(-1)
    for word in (" Yes", " No"):
        ids = tokenizer(text + word, add_special_tokens=False)["input_ids"]
        assert ids[: len(context)] == context and len(ids) == len(context) + 1
        assert scores[word.strip()] == pytest.approx(next_token[ids[-1]].item(), abs=1e-4)
    summary = arrival_judgement.judge(model, tokenizer, arrivals[:3])
    yes, no = (summary[k].split("/") for k in ("yes_right", "no_right"))
    assert int(yes[1]) + int(no[1]) == 3
    assert summary["accuracy"] == pytest.approx((int(yes[0]) + int(no[0])) / 3)


def test_separation_auc_counts_ordered_pairs(arrival_judgement):
    # Pairs (positive, negative): 2>1, 2>0, 1=1 (half), 1>0: 3.5 of 4.
    assert arrival_judgement.separation_auc([2.0, 1.0], [1.0, 0.0]) == pytest.approx(0.875)
    assert arrival_judgement.separation_auc([0.0], [1.0, 2.0]) == 0.0
