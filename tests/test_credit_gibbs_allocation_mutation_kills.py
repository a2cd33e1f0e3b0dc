"""Tests written against the mutants of ``taspo_trl.credit.gibbs_allocation`` that survived
``test_credit_gibbs_allocation.py`` and ``test_credit_baselines.py`` (benchmarks/mutation.sh; the survivors are in
benchmarks/results/mutation_gibbs_allocation_before.json, the equivalent ones in
benchmarks/results/mutation_gibbs_allocation_equivalent.md).

They pin down what a caller relies on: token counts and masks given as integer tensors (as a tokenizer's attention
mask comes), turns and spans without optimised tokens staying out of the credit measure, the exact token mass for
very long turns, and the full text of each error message (which argument is wrong, and its value or shape). Every
expected value is worked out by hand in the test's docstring or comments, or cited from the worked example of
``test_credit_gibbs_allocation.py``."""

from __future__ import annotations

import math
import re
from typing import Callable

import pytest
import torch

from taspo_trl.credit.gibbs_allocation import (
    bounded_normalize,
    gibbs_weights,
    hierarchical_weights,
    neutral_measure,
    span_evidence,
    turn_evidence,
)

NAN = float("nan")
INF = float("inf")
E = math.e


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern that matches ``message`` and nothing longer or shorter."""
    return f"^{re.escape(message)}$"


# --------------------------------------------------------------------------------------------------------------
# turn_evidence


@pytest.mark.parametrize("mask", [torch.tensor([1, 0, 1]), [1, 0, 1]], ids=["long tensor", "int list"])
def test_turn_evidence_reads_a_0_1_integer_mask_as_a_token_selection(mask: torch.Tensor | list[int]) -> None:
    """A 0/1 integer mask (an attention mask) selects tokens 0 and 2: e = sign(A) * (1 + 3) / 2 = +-2.

    Read as integer indices instead, it would average g[[1, 0, 1]] = (2 + 1 + 2) / 3."""
    assert turn_evidence([1.0, 2.0, 3.0], 0.5, mask=mask) == 2.0
    assert turn_evidence([1.0, 2.0, 3.0], -0.5, mask=mask) == -2.0


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: turn_evidence([[1.0, 2.0], [3.0, 4.0]], 1.0), "rectified must be 1-D, got shape (2, 2)"),
        (lambda: turn_evidence([1.0, 2.0, 3.0], 1.0, mask=[True, False]), "mask must have shape (3,), got (2,)"),
        (lambda: turn_evidence([1.0], NAN), "advantage must be finite, got nan"),
        (lambda: turn_evidence([1.0], torch.tensor(-INF)), "advantage must be finite, got -inf"),
    ],
    ids=["2-D rectified", "short mask", "nan advantage", "-inf advantage"],
)
def test_turn_evidence_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """Each refused input is named in the message, with its shape or value."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# span_evidence


def test_span_evidence_keeps_a_turn_with_a_single_token() -> None:
    """n_t = 1 is an optimised turn: E = (2 + 4) / 2 = 3 over turns 0 and 1; turn 2 (n = 0) is left out."""
    assert span_evidence([2.0, 4.0, 6.0], [(0, 3)], token_counts=[1, 3, 0]).tolist() == [3.0]


def test_span_evidence_of_a_span_without_tokens_is_zero_whatever_its_turns_hold() -> None:
    """A span whose turns all have n_t = 0 has E_s = 0 (docstring), even if those turns hold nan / inf
    placeholders; the other span is the mean of its one turn, 1.0."""
    out = span_evidence([NAN, INF, 1.0], [(0, 2), (2, 3)], token_counts=[0, 0, 2])
    assert out.tolist() == [0.0, 1.0]


def test_span_evidence_takes_token_counts_as_a_tensor() -> None:
    """Counts as an integer tensor (as a mask's row sums come): turn 0 (n = 0) is left out, E = 4."""
    assert span_evidence([2.0, 4.0], [(0, 2)], token_counts=torch.tensor([0, 3])).tolist() == [4.0]


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: span_evidence([[1.0, 2.0]], [(0, 2)]), "evidence must be 1-D, got shape (1, 2)"),
        (lambda: span_evidence([1.0, 2.0], [(0, 2)], token_counts=[1]), "1 token counts for 2 turns"),
    ],
    ids=["2-D evidence", "too few counts"],
)
def test_span_evidence_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """The message names the evidence and its shape, or both lengths."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# neutral_measure


def test_neutral_measure_takes_a_count_tensor_and_is_all_zeros_without_tokens() -> None:
    """beta0 = n / N: [1, 3] -> [1/4, 3/4]; N = 0 -> all zeros (docstring), not 0 / 0 = nan."""
    assert neutral_measure(torch.tensor([1, 3])).tolist() == [0.25, 0.75]
    assert neutral_measure([0, 0]).tolist() == [0.0, 0.0]


def test_neutral_measure_refuses_a_negative_count_and_shows_the_counts() -> None:
    """A negative token count is refused, with the counts in the message."""
    with pytest.raises(ValueError, match=exactly("token counts must be >= 0, got [1, -1]")):
        neutral_measure([1, -1])


# --------------------------------------------------------------------------------------------------------------
# hierarchical_weights (temperature 1)


def test_hierarchical_weights_give_one_to_a_turn_without_tokens_in_its_own_span() -> None:
    """n = [0, 1, 1], spans {0}, {1, 2}, e = [1, 2, 0]: turn 0 (n = 0) gets 1.0 (docstring).

    beta0 = [0, 1/2, 1/2]; span {1, 2} holds all the mass, beta = 1; alpha ~ [e^2 / 2, 1 / 2] ->
    [e^2 / (e^2 + 1), 1 / (e^2 + 1)]; w = alpha / beta0 = [2 e^2 / (e^2 + 1), 2 / (e^2 + 1)] = [1.7615942, 0.2384058].
    """
    w = hierarchical_weights([1.0, 2.0, 0.0], [0, 1, 1], [(0, 1), (1, 3)])
    assert w.tolist() == pytest.approx([1.0, 2 * E**2 / (E**2 + 1), 2 / (E**2 + 1)], rel=1e-12)
    assert w[0].item() == 1.0


def test_hierarchical_weights_span_evidence_leaves_out_turns_without_tokens() -> None:
    """n = [1, 0, 1], spans {0, 1}, {2}, e = [1, 5, 0]: turn 1 (n = 0) neither counts in E_0 nor moves off 1.0.

    E = [1, 0] (E_0 = e_0 alone, not (1 + 5) / 2 = 3); beta0 = [1/2, 0, 1/2], beta0_s = [1/2, 1/2];
    beta ~ [e / 2, 1 / 2] -> [e / (e + 1), 1 / (e + 1)]; each span has one live turn (alpha = 1), so
    w = beta_s / beta0_t = [2 e / (e + 1), 1, 2 / (e + 1)] = [1.4621172, 1, 0.5378828]; check 1.4621172 + 0.5378828 = 2.
    """
    w = hierarchical_weights([1.0, 5.0, 0.0], [1, 0, 1], [(0, 2), (2, 3)])
    assert w.tolist() == pytest.approx([2 * E / (E + 1), 1.0, 2 / (E + 1)], rel=1e-12)
    assert w[1].item() == 1.0


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: hierarchical_weights([[1.0, 2.0]], [1, 1], [(0, 2)]), "evidence must be 1-D, got shape (1, 2)"),
        (lambda: hierarchical_weights([1.0, 2.0], [1], [(0, 2)]), "1 token counts for 2 turns"),
        (lambda: hierarchical_weights([INF, 0.0], [1, 1], [(0, 2)]), "evidence must be finite"),
        (
            lambda: hierarchical_weights([1.0, 0.0], [1, 1], [(0, 2)], temperature=0.0),
            "temperature must be a number > 0, got 0.0",
        ),
        (
            lambda: hierarchical_weights([1.0, 0.0], [1, 1], [(0, 2)], temperature=NAN),
            "temperature must be a number > 0, got nan",
        ),
        (
            lambda: hierarchical_weights([1.0, 0.0], [1, 1], [(0, 1)]),
            "spans must be a contiguous partition of [0, 2), got [(0, 1)]",
        ),
        (
            lambda: hierarchical_weights([1.0, 0.0, 2.0], [1, 1, 1], [(0, 1), (2, 3)]),
            "spans must be a contiguous partition of [0, 3), got [(0, 1), (2, 3)]",
        ),
    ],
    ids=["2-D evidence", "too few counts", "inf evidence", "zero temperature", "nan temperature", "short spans", "gap"],
)
def test_hierarchical_weights_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """The message names the argument (evidence, counts, temperature, spans) and its shape or value; a temperature
    of inf is allowed here, so the message does not say "finite"."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# bounded_normalize


def test_bounded_normalize_keeps_the_token_mass_exact_for_very_long_turns() -> None:
    """n = [2^24 + 1, 1], w = [1, 4], eps = 0.5 (bounds [0.5, 1.5]); 2^24 + 1 has no float32 form.

    Near s = 1 turn 1 sits at 4 s > 1.5, so it is clipped to 1.5 and turn 0 takes the rest of N = 2^24 + 2:
    (2^24 + 1) s + 1.5 = 2^24 + 2 -> s = (2^24 + 0.5) / (2^24 + 1) = 0.99999997 (inside the bounds; 4 s > 1.5 holds).
    """
    n0 = 2**24 + 1
    w = bounded_normalize([1.0, 4.0], [n0, 1], eps=0.5)
    assert w.tolist() == pytest.approx([(2**24 + 0.5) / n0, 1.5], rel=1e-12)
    assert n0 * w[0].item() + w[1].item() == pytest.approx(2**24 + 2, abs=1e-6)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: bounded_normalize([[1.0, 2.0]], [1, 1]), "weights must be 1-D, got shape (1, 2)"),
        (lambda: bounded_normalize([1.0, 2.0], [1]), "1 token counts for 2 weights"),
        (lambda: bounded_normalize([0.0, 2.0], [1, 1]), "weights of turns with tokens must be finite and > 0"),
        (lambda: bounded_normalize([NAN, 2.0], [1, 1]), "weights of turns with tokens must be finite and > 0"),
        (lambda: bounded_normalize([1.0, 2.0], [1, 1], eps=1.0), "eps must satisfy 0 <= eps < 1, got 1.0"),
        (lambda: bounded_normalize([1.0, 2.0], [1, 1], eps=-0.1), "eps must satisfy 0 <= eps < 1, got -0.1"),
    ],
    ids=["2-D weights", "too few counts", "zero weight", "nan weight", "eps 1", "negative eps"],
)
def test_bounded_normalize_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """The message names the weights, the counts or eps, with the shape, lengths or value."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


# --------------------------------------------------------------------------------------------------------------
# gibbs_weights


def test_gibbs_weights_take_token_counts_as_a_tensor() -> None:
    """The worked example of test_credit_gibbs_allocation.py (n = [2, 2, 4], spans {0, 1}, {2}, e = [ln 3, 0, 0],
    temp 1, eps 0.5 -> w = [1.5, 0.7554237, 0.8722882]) with n as an integer tensor."""
    w = gibbs_weights([math.log(3.0), 0.0, 0.0], torch.tensor([2, 2, 4]), [(0, 2), (2, 3)])
    assert w.tolist() == pytest.approx([1.5, 0.7554237, 0.8722882], abs=1e-7)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: gibbs_weights([[1.0, 2.0]], [1, 1], [(0, 2)]), "evidence must be 1-D, got shape (1, 2)"),
        (lambda: gibbs_weights([NAN, 1.0], [1, 1], [(0, 2)]), "evidence must be finite"),
        (lambda: gibbs_weights([0.5, 1.0], [1, 1], [(0, 2)], eps=1.5), "eps must satisfy 0 <= eps < 1, got 1.5"),
        (
            lambda: gibbs_weights([0.5, 1.0], [1, 1], [(0, 2)], temperature=-1.0),
            "temperature must be a number > 0, got -1.0",
        ),
        # all evidence 0: the early return to all ones still checks every argument
        (
            lambda: gibbs_weights([0.0, 0.0], [1, 1], [(0, 2)], temperature=0.0),
            "temperature must be a number > 0, got 0.0",
        ),
        (
            lambda: gibbs_weights([0.0, 0.0], [1, 1], [(0, 2)], temperature=-INF),
            "temperature must be a number > 0, got -inf",
        ),
        (lambda: gibbs_weights([0.0, 0.0], [1], [(0, 2)]), "1 token counts for 2 turns"),
        (lambda: gibbs_weights([0.0, 0.0], [1, -1], [(0, 2)]), "token counts must be >= 0, got [1, -1]"),
        (
            lambda: gibbs_weights([0.0, 0.0, 0.0], [1, 1, 1], [(0, 1), (2, 3)]),
            "spans must be a contiguous partition of [0, 3), got [(0, 1), (2, 3)]",
        ),
        (
            lambda: gibbs_weights([0.0, 0.0, 0.0], [1, 1, 1], [(0, 2)]),
            "spans must be a contiguous partition of [0, 3), got [(0, 2)]",
        ),
    ],
    ids=[
        "2-D evidence",
        "nan evidence",
        "eps above 1",
        "negative temperature",
        "zero evidence, zero temperature",
        "zero evidence, -inf temperature",
        "zero evidence, too few counts",
        "zero evidence, negative count",
        "zero evidence, gap in spans",
        "zero evidence, short spans",
    ],
)
def test_gibbs_weights_error_messages_name_the_bad_argument(call: Callable[[], object], message: str) -> None:
    """Every refused argument is named with its value or shape, whether or not some evidence is nonzero."""
    with pytest.raises(ValueError, match=exactly(message)):
        call()


def test_span_evidence_leaves_out_a_tokenless_turn_even_when_its_placeholder_is_not_finite() -> None:
    """Turns 0 and 2 have tokens (evidence 0.2 and 0.4), turn 1 none and a NaN placeholder: E = (0.2 + 0.4) / 2."""
    e = span_evidence([0.2, float("nan"), 0.4], [(0, 3)], token_counts=[3, 0, 1])
    assert e.tolist() == pytest.approx([0.3], abs=1e-12)
