"""``benchmarks/pi_specificity.py``: the foreign-context rotation by hand, and a smoke run with a tiny random
policy (wiring, not figures)."""

from __future__ import annotations

import json
import math

import pytest


@pytest.fixture(scope="module")
def pi_specificity(load_benchmark):
    return load_benchmark("pi_specificity")


def test_foreign_context_is_the_same_sibling_of_the_next_group(pi_specificity):
    contexts = ["p0", "p1", "", "p3", "p4", "p5"]  # groups of 2: (0, 1), (2, 3), (4, 5)
    assert pi_specificity.foreign_contexts(contexts, 2) == ["", "p3", "", "p5", "p0", "p1"]


def test_an_empty_context_stays_empty_and_a_foreign_one_may_be_empty(pi_specificity):
    # groups of 2: (0, 1), (2, 3); trajectory 3's foreign context is trajectory 1's, which is empty
    assert pi_specificity.foreign_contexts(["a", "", "c", "d"], 2) == ["c", "", "a", ""]
    assert pi_specificity.foreign_contexts(["a", "b", "c"], 1) == ["b", "c", "a"]


def test_gap_share_by_hand(pi_specificity):
    assert pi_specificity.gap_share([0.1, 0.3], [-0.5, -1.5]) == pytest.approx(0.4 / 2.0)
    assert pi_specificity.gap_share([], []) is None
    assert pi_specificity.gap_share([0.0], [0.0]) is None  # no gap to share


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


def test_plain_logprobs_and_gap_shares(pi_specificity, tiny_model_dir, tmp_path, capsys):
    # 3 siblings: the two walkthrough wins and one stalling failure per game, so both groups have a PI
    out = tmp_path / "out"
    results = pi_specificity.main([
        "--model", tiny_model_dir, "--task-types", "pick_and_place_simple", "look_at_obj_in_light",
        "--group-size", "3", "--max-turns", "2", "--max-completion-length", "8", "--no-bf16", "--out", str(out),
    ])
    written = json.loads((out / "pi_specificity.json").read_text())
    assert written == json.loads(json.dumps(results))
    shifts = written["shifts"]
    assert written["actions"] == len(shifts) > 0
    assert written["settings"]["env"] == "alfworld"
    for s in shifts:
        assert math.isfinite(s["plain_logprob"]) and s["plain_logprob"] <= 0
        # a log-prob with the PI is at most 0, so the mean shift is at most the gap -plain_logprob
        assert s["own_pi"] <= -s["plain_logprob"] + 1e-6 and s["foreign_pi"] <= -s["plain_logprob"] + 1e-6
    quoted = [s for s in shifts if s["quoted"]]
    assert written["quoted_actions"] == len(quoted) > 0
    assert written["quoted_actions"] + sum(not s["quoted"] for s in shifts) == written["actions"]
    gap = sum(-s["plain_logprob"] for s in quoted)
    assert written["gap_share_own_quoted"] == pytest.approx(sum(s["own_pi"] for s in quoted) / gap)
    assert written["gap_share_foreign_quoted"] == pytest.approx(sum(s["foreign_pi"] for s in quoted) / gap)
    assert written == {**written, **pi_specificity.correlation_figures(shifts)}  # the figures of its own shifts
    assert "share of the quoted actions' gap" in capsys.readouterr().out


def _record(trajectory, won, own, foreign):
    return {"trajectory": trajectory, "won": won, "own_pi": own, "foreign_pi": foreign}


def test_correlation_figures_by_hand(pi_specificity):
    # won trajectory 0: foreign follows own exactly (+1); failed trajectory 1: foreign runs against own (-1)
    shifts = [_record(0, True, 0.0, 0.0), _record(0, True, 1.0, 1.0), _record(0, True, 2.0, 2.0),
              _record(1, False, 0.0, 2.0), _record(1, False, 1.0, 1.0), _record(1, False, 2.0, 0.0)]
    figures = pi_specificity.correlation_figures(shifts, resamples=200)
    assert figures["correlation_by_outcome"] == {"won": pytest.approx(1.0), "failed": pytest.approx(-1.0)}
    # pooled: own (0,1,2,0,1,2) against foreign (0,1,2,2,1,0): covariance 0, so no correlation
    assert figures["correlation"] == pytest.approx(0.0, abs=1e-12)
    low, high = figures["correlation_interval_95"]
    # a replicate draws trajectory 0 twice (+1), trajectory 1 twice (-1) or each once (0)
    assert low == pytest.approx(-1.0) and high == pytest.approx(1.0)


def test_correlation_figures_leave_undefined_ones_out(pi_specificity):
    # every action of the failed trajectory has the same foreign shift: no correlation there
    shifts = [_record(0, True, 0.0, 1.0), _record(0, True, 1.0, 2.0), _record(1, False, 0.0, 0.5),
              _record(1, False, 3.0, 0.5)]
    figures = pi_specificity.correlation_figures(shifts, resamples=100)
    assert figures["correlation_by_outcome"] == {"won": pytest.approx(1.0), "failed": None}
    one_trajectory = pi_specificity.correlation_figures(shifts[:2], resamples=100)
    assert one_trajectory["correlation"] == pytest.approx(1.0) and one_trajectory["correlation_interval_95"] is None


def test_resummarize_recomputes_a_written_result_in_place(pi_specificity, tmp_path):
    shifts = [_record(0, True, 0.0, 0.0), _record(0, True, 1.0, 1.0), _record(1, False, 0.0, 1.0),
              _record(1, False, 1.0, 0.0)]
    path = tmp_path / "pi_specificity.json"
    path.write_text(json.dumps({"shifts": shifts, "correlation": 0.9, "provenance": {"command": "the run"}}))
    results = pi_specificity.main(["--resummarize", str(path)])
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(results))
    assert written["shifts"] == shifts and written["provenance"] == {"command": "the run"}
    assert written["correlation"] == pytest.approx(0.0, abs=1e-12)  # (0,1,0,1) against (0,1,1,0)
    assert written["correlation_by_outcome"] == {"won": pytest.approx(1.0), "failed": pytest.approx(-1.0)}
    assert "--resummarize" in written["resummarized"]["command"]
