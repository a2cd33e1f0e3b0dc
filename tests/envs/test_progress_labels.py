"""Progress labels for WebShop (the oracle's remaining steps to buying the goal) and Search-QA (a search that
found a fact the answer needs, or the right answer), checked on hand-made episodes whose distances are counted by
hand from the goal: search, page, product, each goal option, buy."""

from __future__ import annotations

import pytest

from taspo_trl.envs.base import task_spec_from_row
from taspo_trl.envs.search import search_task_rows
from taspo_trl.envs.search.progress import needed_facts, search_progress
from taspo_trl.envs.webshop import webshop_task_rows
from taspo_trl.envs.webshop.progress import webshop_distances, webshop_progress


@pytest.fixture(scope="module")
def goal_0():
    """Eval goal 0: wireless earbuds, option color white; its first search shows the product on page 1."""
    spec = task_spec_from_row(webshop_task_rows(split="eval", max_tasks=1)[0])
    return spec, "search[wireless earbuds water resistant fast charging long battery life]", "click[b0cz6843me]"


def test_the_oracle_path_counts_down_one_step_at_a_time(goal_0):
    spec, search, product = goal_0
    commands = [search, product, "click[white]", "click[buy now]"]
    # search + product + 1 option + buy = 4 steps from the start page
    assert webshop_distances(spec, commands) == [4, 3, 2, 1, 0]
    assert webshop_progress(webshop_distances(spec, commands)) == [True] * 4


def test_detours_wrong_options_and_invalid_turns_are_not_progress(goal_0):
    spec, search, product = goal_0
    commands = [search, "click[next >]", "click[< prev]", product, "click[description]", "click[< prev]", "",
                "click[white]", "click[buy now]"]
    distances = webshop_distances(spec, commands)
    # page 2 needs "< prev" first (+1); the description page needs "< prev" back (+1); "" changes nothing
    assert distances == [4, 3, 4, 3, 2, 3, 2, 2, 1, 0]
    assert webshop_progress(distances) == [True, False, True, True, False, True, False, True, True]


def test_a_wrong_purchase_ends_progress(goal_0):
    spec, search, product = goal_0
    distances = webshop_distances(spec, [search, product, "click[buy now]"])  # no colour chosen: score < 1
    assert distances == [4, 3, 2, None]
    assert webshop_progress(distances) == [True, True, False]
    assert webshop_progress([None, 3, 2]) == [None, True]


def test_server_specs_are_refused():
    with pytest.raises(ValueError, match="embedded catalogue"):
        webshop_distances({"url": "http://127.0.0.1:1", "goal_index": 0}, [])


def _multi_hop_spec():
    for row in search_task_rows(split="train"):
        spec = task_spec_from_row(row)
        if spec["task_type"] == "embedded_multi":
            return spec
    raise AssertionError("no two-hop question")


def test_search_progress_on_a_two_hop_question():
    spec = _multi_hop_spec()
    bridge, answer = needed_facts(spec)
    commands = ["<search>nothing useful</search>", "<search>x</search>", "<search>y</search>", "",
                "<answer>wrong</answer>", f"<answer>{spec['golden_answers'][0]}</answer>"]
    observations = [
        "<information>Doc 1(Title: Other) unrelated text</information>",
        f"<information>Doc 1(Title: A) born in {bridge}.</information>",  # the bridge fact: progress
        f"<information>Doc 1(Title: A) born in {bridge}.</information>",  # seen already: none
        "Invalid action.",
        "wrong answer",
        "correct",
    ]
    assert search_progress(spec, commands, observations) == [False, True, False, False, False, True]


def test_search_progress_without_hops_looks_for_the_gold_answer():
    spec = {"question": "Who wrote it?", "golden_answers": ["Ada Lovelace"], "id": "nq-1"}
    assert needed_facts(spec) == ["Ada Lovelace"]
    commands = ["<search>who wrote it</search>", "<answer>the Ada Lovelace</answer>"]
    observations = ["<information>Doc 1(Title: Notes) written by Ada Lovelace, 1843.</information>", ""]
    assert search_progress(spec, commands, observations) == [True, True]
    assert search_progress(spec, ["<search>q</search>"], ["Lovelaces of Ada"]) == [False]


def test_search_progress_checks_its_inputs():
    with pytest.raises(ValueError, match="2 commands for 1 observations"):
        search_progress({"golden_answers": ["x"], "question": "q"}, ["", ""], [""])
