"""``privileged/rescoring.py`` on hand-made trajectories, a character-level "chat template" and a log-prob function
whose value at each token encodes the token, its predecessor and how many tokens it attends to, so any misplaced
prompt, padding or span changes the numbers.

Tests written against the mutants that survived the credit modules' own tests (benchmarks/mutation.sh; the list
and the equivalent mutants are in benchmarks/results/mutation.md). Each names what it pins down."""

from __future__ import annotations

import pytest
import torch


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
