"""``benchmarks/pi_specificity.py``: the foreign-context rotation by hand, and a smoke run with a tiny random
policy (wiring, not figures)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def pi_specificity(load_benchmark):
    return load_benchmark("pi_specificity")


def test_foreign_context_is_the_same_sibling_of_the_next_group(pi_specificity):
    contexts = ["p0", "p1", "", "p3", "p4", "p5"]  # groups of 2: (0, 1), (2, 3), (4, 5)
    assert pi_specificity.foreign_contexts(contexts, 2) == ["", "p3", "", "p5", "p0", "p1"]


def test_one_family_is_refused_before_any_work(pi_specificity, tmp_path):
    with pytest.raises(SystemExit):
        pi_specificity.main(["--model", "unused", "--task-types", "pick_and_place_simple", "--out", str(tmp_path)])


@pytest.mark.slow  # about a minute on 2 cores
def test_smoke(pi_specificity, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    results = pi_specificity.main([
        "--model", tiny_model_dir, "--task-types", "pick_and_place_simple", "look_at_obj_in_light",
        "--max-turns", "3", "--max-completion-length", "8", "--out", str(out),
    ])
    assert json.loads((out / "pi_specificity.json").read_text()) == json.loads(json.dumps(results))
    assert results["actions"] == len(results["shifts"]) > 0
    assert all(s["won"] for s in results["shifts"] if s["trajectory"] % 4 < 2)  # the walkthrough siblings win


def test_an_action_is_quoted_only_as_a_whole_command(pi_specificity):
    context = '- Go to the drawer before you take the cd ("go to drawer 4").\n- Required: "take cd 1 from drawer 4".'
    assert pi_specificity.quoted("go to drawer 4", context)
    assert pi_specificity.quoted("take cd 1 from drawer 4", context)
    assert not pi_specificity.quoted("go to drawer 40", context)
    assert not pi_specificity.quoted("drawer 4", context)  # a fragment of a quoted command is not quoted
    assert not pi_specificity.quoted("", context) and not pi_specificity.quoted("go to drawer 4", "")
