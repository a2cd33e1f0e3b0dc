"""Tests written against the mutants that survived the credit modules' own tests (benchmarks/mutation.sh; the list
and the equivalent mutants are in benchmarks/results/mutation.md). Each names what it pins down."""

from __future__ import annotations

import math

import pytest
import torch

from taspo_trl.credit.grpo import grpo_outcome_advantages


@pytest.mark.parametrize(
    "rewards,group_size,delta,message",
    [
        (torch.zeros(2, 2), 2, 1e-4, r"rewards must be 1-D, got shape \(2, 2\)"),
        (torch.zeros(4), 0, 1e-4, "group_size must be a positive int, got 0"),
        (torch.zeros(3), 2, 1e-4, r"len\(rewards\)=3 is not a multiple of group_size=2"),
        (torch.zeros(4), 2, 0.0, "delta must be > 0, got 0.0"),
        (torch.tensor([1.0, float("inf")]), 2, 1e-4, r"rewards must be finite or NaN \(unscorable\); got an infinite reward"),
    ],
)
def test_grpo_advantages_errors_name_the_bad_input(rewards, group_size, delta, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        grpo_outcome_advantages(rewards, group_size, delta=delta)


# --------------------------------------------------------------------------------------------------------------
# privileged/rescoring.py on hand-made trajectories, a character-level "chat template" and a log-prob function
# whose value at each token encodes the token, its predecessor and how many tokens it attends to, so any
# misplaced prompt, padding or span changes the numbers.


class CharChat:
    """``ChatFormat``'s one method the rescoring uses: a first prompt is "<" + text + ">" as character codes."""

    @staticmethod
    def first_prompt_ids(user_text: str) -> list[int]:
        return [ord(c) for c in f"<{user_text}>"]


def fake_logprobs(input_ids: torch.Tensor, attention: torch.Tensor, keep: int, calls: list | None = None) -> torch.Tensor:
    if calls is not None:
        calls.append(input_ids.size(0))
    width = input_ids.size(1)
    out = torch.zeros(input_ids.size(0), keep)
    for r in range(input_ids.size(0)):
        for j in range(keep):
            pos = width - keep + j
            attended = int(attention[r, :pos].sum())
            out[r, j] = -(1e-3 * int(input_ids[r, pos]) + 1e-5 * int(input_ids[r, pos - 1]) + 0.1 * attended)
    return out


def hand_logprobs(prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """``fake_logprobs`` of an unpadded row, computed token by token."""
    row = prompt + continuation
    return torch.tensor([-(1e-3 * row[k] + 1e-5 * row[k - 1] + 0.1 * k) for k in range(len(prompt), len(row))])


def _turn(prompt_text: str, response: list[int], span: tuple[int, int], prompt_ids: list[int] | None = None):
    from taspo_trl.rollout.records import Turn

    prompt = CharChat.first_prompt_ids(prompt_text) if prompt_ids is None else prompt_ids
    return Turn(prompt, response, [0.0] * len(response), "", "a", True, "", span, "obs", prompt_text)


def _trajectory(turns):
    from taspo_trl.rollout.records import Trajectory

    return Trajectory({}, "task", "start", 0, turns=turns)


def test_score_continuations_aligns_every_row_whatever_its_padding():
    from taspo_trl.privileged.rescoring import score_continuations

    pairs = [([5, 6, 7], [8, 9]), ([5], [10, 11, 12, 13]), ([1, 2, 3, 4, 5, 6], [7]), ([9, 9], [3, 4, 5])]
    calls: list = []
    scored = score_continuations(pairs, lambda *a: fake_logprobs(*a, calls=calls), pad_token_id=0, min_rows=6, batch_size=4)
    assert calls == [4, 2]  # six rows (two one-token pads) in chunks of four
    assert len(scored) == 6
    for (prompt, continuation), values in zip(pairs, scored):
        torch.testing.assert_close(values, hand_logprobs(prompt, continuation))
    assert [len(values) for values in scored[4:]] == [1, 1]


def test_rescored_rows_are_the_policy_rows_of_trajectories_with_pi():
    from taspo_trl.privileged.rescoring import rescored_rows
    from taspo_trl.rollout.layouts import build_rows

    trajectories = [
        _trajectory([_turn("a", [1, 2], (0, 1)), _turn("b", [3], (0, 1))]),
        _trajectory([_turn("c", [4], (0, 1))]),
        _trajectory([_turn("d", [5, 6], (1, 2))]),
        _trajectory([]),  # its environment failed at reset: no turn to score
    ]
    rows = build_rows(trajectories, "turn", pad_to_multiple=3, pad_token_id=0)
    assert len(rows) == 6  # four turns, two padding rows
    assert rescored_rows(rows, ["P", "", "Q", "R"]) == [0, 1, 3]
    sequence = build_rows(trajectories[1:], "sequence", pad_token_id=0)  # one row per trajectory
    assert rescored_rows(sequence, ["P", "", "R"]) == [0]  # the failed reset's placeholder row has no policy token


def test_privileged_prompt_goes_before_the_first_user_message():
    from taspo_trl.privileged.rescoring import privileged_prompt_ids

    chat = CharChat()
    first = _turn("look", [1], (0, 1))
    # turn layout: every turn's prompt is its own first message
    turn_layout = _trajectory([first, _turn("go", [2], (0, 1))])
    assert privileged_prompt_ids(turn_layout, 1, "PI", chat) == chat.first_prompt_ids("PI\n\ngo")
    assert privileged_prompt_ids(turn_layout, 0, "PI", chat) == chat.first_prompt_ids("PI\n\nlook")
    # sequence layout: the later prompt extends the first; only the first message gets the PI
    history = first.prompt_ids + [1, 99, 98]
    sequence = _trajectory([first, _turn("obs", [2], (0, 1), prompt_ids=history)])
    assert privileged_prompt_ids(sequence, 1, "PI", chat) == chat.first_prompt_ids("PI\n\nlook") + [1, 99, 98]


@pytest.mark.parametrize("action_only", [True, False])
def test_privileged_token_shifts_by_hand(action_only):
    from taspo_trl.privileged.rescoring import privileged_token_shifts
    from taspo_trl.rollout.layouts import build_rows
    from trl.trainer.utils import pad

    chat = CharChat()
    trajectories = [
        _trajectory([_turn("a", [11, 12, 13], (1, 3)), _turn("bb", [14, 15], (0, 0))]),  # turn 1: no action
        _trajectory([_turn("c", [16, 17], (0, 2))]),  # no PI
        _trajectory([_turn("dd", [18, 19, 20, 21], (2, 4)), _turn("e", [22], (0, 1))]),
    ]
    pi = ["P1", "", "P2"]
    rows = build_rows(trajectories, "turn", pad_to_multiple=4, pad_token_id=0)
    plain = pad([hand_logprobs(p, c) for p, c in zip(rows.prompt_ids, rows.completion_ids)], 0.0, "right")
    shifts = privileged_token_shifts(rows, trajectories, pi, chat, fake_logprobs, plain, 0, batch_size=2, action_only=action_only)
    expected = {}
    for i, trajectory in enumerate(trajectories):
        if not pi[i]:
            continue
        for t, turn in enumerate(trajectory.turns):
            start, end = turn.action_span if action_only else (0, len(turn.response_ids))
            if end > start:
                privileged = chat.first_prompt_ids(f"{pi[i]}\n\n{turn.prompt_text}")
                delta = hand_logprobs(privileged, turn.response_ids) - hand_logprobs(turn.prompt_ids, turn.response_ids)
                expected[(i, t)] = delta[start:end].double()
    assert shifts.keys() == expected.keys()
    for key, value in expected.items():
        assert shifts[key].dtype == torch.float64
        torch.testing.assert_close(shifts[key], value, atol=1e-6, rtol=0)


def test_score_continuations_chunks_rows_of_similar_length_and_pads_only_to_min_rows():
    """Rows go through in order of length, eight per forward by default, each chunk padded to its own longest
    prompt and continuation; no padding row unless ``min_rows`` asks for it."""
    from taspo_trl.privileged.rescoring import score_continuations

    # total lengths 10, 2, 9, 3, ..., so sorting interleaves the list; prompt and continuation lengths differ
    pairs = [([1] * (k + 1), [2] * (10 - k if k % 2 == 0 else k + 1)) for k in range(10)]
    shapes: list = []

    def record(input_ids, attention, keep):
        shapes.append((tuple(input_ids.shape), keep, sorted(set(input_ids[attention == 0].tolist()))))
        return fake_logprobs(input_ids, attention, keep)

    scored = score_continuations(pairs, record, pad_token_id=7)
    order = sorted(range(10), key=lambda k: len(pairs[k][0]) + len(pairs[k][1]))
    want = []
    for chunk in (order[:8], order[8:]):
        width_p = max(len(pairs[k][0]) for k in chunk)
        width_c = max(len(pairs[k][1]) for k in chunk)
        want.append(((len(chunk), width_p + width_c), width_c))
    assert [(shape, keep) for shape, keep, _ in shapes] == want
    assert all(fill in ([], [7]) for *_, fill in shapes)  # padding is the pad token
    assert len(scored) == 10
    for (prompt, continuation), values in zip(pairs, scored):
        torch.testing.assert_close(values, hand_logprobs(prompt, continuation))
    shapes.clear()
    assert score_continuations([], record, pad_token_id=7) == [] and shapes == []
    assert len(score_continuations([], record, pad_token_id=7, min_rows=2)) == 2
    assert shapes[0][0] == (2, 2) and shapes[0][2] == []  # two one-token rows of the pad token, fully attended


def test_privileged_token_shifts_defaults_and_its_scoring_settings():
    """The defaults: action spans only, no padding rows, eight rows per forward; ``pad_token_id``, ``min_rows`` and
    ``batch_size`` reach the scorer."""
    from taspo_trl.privileged.rescoring import privileged_token_shifts
    from taspo_trl.rollout.layouts import build_rows
    from trl.trainer.utils import pad

    chat = CharChat()
    trajectories = [_trajectory([_turn(f"t{k}", [11 + k, 12, 13], (1, 3)) for k in range(9)])]
    rows = build_rows(trajectories, "turn", pad_token_id=0)
    plain = pad([hand_logprobs(p, c) for p, c in zip(rows.prompt_ids, rows.completion_ids)], 0.0, "right")
    calls: list = []

    def record(input_ids, attention, keep):
        pad_rows = sum(bool((row[mask == 1] == 5).all()) for row, mask in zip(input_ids, attention))
        calls.append((input_ids.size(0), pad_rows))
        return fake_logprobs(input_ids, attention, keep)

    assert privileged_token_shifts(rows, trajectories, [""], chat, record, plain, 5) == {} and calls == []  # no PI: no pass
    shifts = privileged_token_shifts(rows, trajectories, ["P"], chat, record, plain, 5)
    assert [n for n, _ in calls] == [8, 1] and sorted(shifts) == [(0, t) for t in range(9)]
    assert all(value.numel() == 2 for value in shifts.values())  # the action span (1, 3), not the response
    calls.clear()
    privileged_token_shifts(rows, trajectories, ["P"], chat, record, plain, 5, min_rows=12, batch_size=5)
    assert [n for n, _ in calls] == [5, 5, 2]
    assert sum(pads for _, pads in calls) == 3  # three padding rows of the pad token alone


# --------------------------------------------------------------------------------------------------------------
# credit/taspo.py: argument checks, defaults and dtypes the paper-property tests leave open


def test_taspo_argument_errors_name_the_bad_value():
    from taspo_trl.credit import taspo

    cases = [
        (lambda: taspo.taspo_weights([0.1, 0.2], float("nan")), r"^advantage must be finite, got nan$"),
        (lambda: taspo.clip_token_shifts([[0.1]]), r"^token_shifts must be 1-D \(one action span\), got shape \(1, 1\)$"),
        (lambda: taspo.clip_token_shifts([0.1], c_delta=0.0), r"^c_delta must be a finite number > 0, got 0.0$"),
        (lambda: taspo.clip_token_shifts([0.1], kappa=-1.0), r"^kappa must be None \(no filter\) or a finite number >= 0, got -1.0$"),
        (lambda: taspo.taspo_weights([0.1, 0.2], 1.0, tau=0.0), r"^tau must be a finite number > 0, got 0.0$"),
        (lambda: taspo.taspo_weights([0.1, 0.2], 1.0, eps_w=1.0), r"^eps_w must satisfy 0 <= eps_w < 1, got 1.0$"),
        (lambda: taspo.taspo_weights(torch.zeros(2, 2), 1.0), r"^action_scores must be 1-D, got shape \(2, 2\)$"),
        (lambda: taspo.mean_one_weights(torch.zeros(2), eps_w=1.0), r"^eps_w must satisfy 0 <= eps_w < 1, got 1.0$"),
        (lambda: taspo.support_scores(torch.zeros(2), 0.0), r"^Eq. 5 is undefined for A_i == 0; use taspo_weights, which falls back to unit weights$"),
        (lambda: taspo.support_scores(torch.zeros(2), 1.0, tau=0.0), r"^tau must be a finite number > 0, got 0.0$"),
        (lambda: taspo.support_scores(torch.zeros(2), 1.0, tau=-1.0), r"^tau must be a finite number > 0, got -1.0$"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    for eps_w in (1.0, 1.5):  # w = 1 + (eps_w / 2)(q - mean q) reaches 0 at eps_w = 1: refused
        with pytest.raises(ValueError, match="eps_w"):
            taspo.taspo_weights([0.1, 0.2], 1.0, eps_w=eps_w)
        with pytest.raises(ValueError, match="eps_w"):
            taspo.mean_one_weights(torch.zeros(2), eps_w=eps_w)
    # refused in the fallbacks too (one scorable turn or token, none at all), where Eq. 6 never runs
    for scores, shifts in (([0.1], [[0.1]]), ([None, None], [None, None])):
        with pytest.raises(ValueError, match="eps_w"):
            taspo.taspo_weights(scores, 1.0, eps_w=1.0)
        with pytest.raises(ValueError, match="eps_w"):
            taspo.taspo_token_weights(shifts, 1.0, eps_w=1.5)
    with pytest.raises(ValueError, match="kappa"):  # checked even when no turn has shifts
        taspo.taspo_token_weights([None, None], 1.0, kappa=-1.0)


def test_taspo_defaults_and_float64_outputs():
    """The paper's defaults (tau 0.5, eps_w 0.4) in the pure functions, and float64 whatever the input dtype."""
    from taspo_trl.credit import taspo

    q = torch.tensor([1.0, -1.0], dtype=torch.float32)
    assert taspo.mean_one_weights(q).tolist() == pytest.approx([1.2, 0.8])  # 1 + (0.4 / 2)(q - 0)
    assert taspo.support_scores(torch.tensor([0.5, -0.5]), 1.0).tolist() == pytest.approx([math.tanh(1.0), -math.tanh(1.0)])
    assert taspo.center_scores(q).dtype == torch.float64
    assert taspo.mean_one_weights(q).dtype == torch.float64
    assert taspo.support_scores(q, -1.0).dtype == torch.float64


def test_taspo_token_level_counts_and_clips_every_scored_turn():
    from taspo_trl.credit import taspo

    # an unscored turn first must not stop the count of the scored tokens after it
    assert taspo.taspo_token_fallback_reason([None, [0.1, 0.2]], 1.0) is None
    assert taspo.taspo_token_fallback_reason([None, [0.1]], 1.0) == "few_scorable"
    # c_delta reaches the token clip: shifts 0.5 and 3 clip to 0.5 and 1 (c = 1), not to 0.5 and 2 (the default)
    weights = taspo.taspo_token_weights([[0.5, 3.0]], 1.0, c_delta=1.0, tau=1.0, eps_w=0.4)
    q = math.tanh(0.25)  # centred clipped scores -0.25, +0.25
    assert torch.cat(weights).tolist() == pytest.approx([1 - 0.2 * q, 1 + 0.2 * q])
