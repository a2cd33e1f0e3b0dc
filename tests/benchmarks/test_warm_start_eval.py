"""``benchmarks/warm_start_eval.py``: its Wilson intervals against hand-computed ones, and a smoke run of ``main``
with a tiny random policy on unseen games and on fresh train games."""

from __future__ import annotations

from taspo_trl.evaluation import wilson_interval

import json

import pytest


@pytest.fixture(scope="module")
def warm_start_eval(load_benchmark):
    return load_benchmark("warm_start_eval")


def test_wilson_interval_matches_hand_computed_values(warm_start_eval):
    # 2 of 12: centre (1/6 + 1.96^2/24) / (1 + 1.96^2/12) = 0.2475, half-width 0.2005.
    assert wilson_interval(2, 12) == pytest.approx((0.0470, 0.4480), abs=5e-4)
    # 0 of 10: the lower end is 0 and the upper 2 * 0.19208 / 1.38416 = 0.2775.
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_main_plays_unseen_and_fresh_train_games(warm_start_eval, tiny_model_dir, tmp_path):
    from taspo_trl.warmstart import FRESH_GAMES_SEED

    out = tmp_path / "eval.json"
    results = warm_start_eval.main([
        "--models", tiny_model_dir, "--games-per-type", "1", "--train-games-per-type", "1", "--siblings", "2",
        "--eval-turns", "2", "--train-turns", "2", "--max-completion-length", "4", "--no-bf16",
        "--games-dir", str(tmp_path / "games"), "--out", str(out),
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["provenance"]["command"].startswith("python benchmarks/warm_start_eval.py --models")
    assert results["settings"]["train_games_seed"] == FRESH_GAMES_SEED
    assert [model["model"] for model in results["models"]] == [tiny_model_dir]
    unseen, train = results["models"][0]["eval_unseen_greedy"], results["models"][0]["train_siblings_t1"]
    assert unseen["episodes"] == 6 and sum(unseen["wins_per_family"].values()) == unseen["wins"]
    assert len(unseen["success_per_family"]) == 6
    assert train["episodes"] == 12 and train["groups"] == 6 and len(train["wins_per_group"]) == 6
    low, high = train["success_interval_95"]
    assert 0.0 <= low <= train["success"] <= high <= 1.0
    # The fresh train games come from the quickstarts' seed, which no warm start trained on.
    assert {path.name.split("_")[1] for path in (tmp_path / "games" / "train").rglob("trial_*")} == {f"s{FRESH_GAMES_SEED}"}


def test_a_label_per_model_or_a_clear_error(warm_start_eval, capsys):
    with pytest.raises(SystemExit):
        warm_start_eval.main(["--models", "a", "b", "--labels", "only-one"])
    assert "give one label each" in capsys.readouterr().err
