"""Action-block location (characters and tokens, TASPO A.3) and action parsing, on the real embedded tokenizer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from taspo_trl.rollout.spans import (
    EMPTY_SPAN,
    ParsedAction,
    find_action_block,
    locate_action_span,
    parse_action,
    parse_env_action,
)

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Filler text mixes tag-like punctuation, whitespace and arbitrary unicode (incl. multi-byte characters that
# byte-level BPE splits across tokens), so tags land on every kind of token boundary.
_chars = st.one_of(
    st.sampled_from(list(" \n\t<>/.,:!?=abcxyzABC-_")),
    st.characters(codec="utf-8", exclude_categories=("Cs",)),
)
filler = st.text(_chars, max_size=40)
tag_names = st.sampled_from(["action", "search", "answer"])


@st.composite
def any_case(draw, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(c.upper() if flip else c for c, flip in zip(word, flips, strict=True))


@st.composite
def tagged_block(draw) -> str:
    name = draw(tag_names)
    return f"<{draw(any_case(name))}>{draw(filler)}</{draw(any_case(name))}>"


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def assert_minimal_cover(tokenizer, ids: list[int], span: tuple[int, int], block: str) -> None:
    """The span's tokens decode to text containing the block, and neither edge token can be dropped."""
    start, end = span
    assert 0 <= start < end <= len(ids)
    assert block in decode(tokenizer, ids[start:end])
    assert block not in decode(tokenizer, ids[start + 1 : end])
    assert block not in decode(tokenizer, ids[start : end - 1])


class PieceBlindTokenizer:
    """The real tokenizer, except that single tokens decode to nothing useful.

    Stands in for tokenizers whose tokens do not decode individually, forcing the A.3 fallback.
    """

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def batch_decode(self, sequences, **kwargs) -> list[str]:
        return ["\ufffd" for _ in sequences]

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


# --- find_action_block ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<action>go</action>", (0, 19)),
        ("I think.\n<Action>\ngo to\nfridge 1\n</ACTION>\n", (9, 42)),
        ("<search>q</search> then <answer>a</answer>", (0, 18)),
        ("<answer>a</answer><action>b</action>", (0, 18)),
        ("<action>open <search>q</search>", (13, 31)),  # the unclosed block is skipped
        ("<action>a<action>b</action>", (9, 27)),  # a stray opening tag is not part of the block
        ("<action></action>", (0, 17)),
    ],
)
def test_find_action_block_cases(text: str, expected: tuple[int, int]) -> None:
    assert find_action_block(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no tags",
        "<action>go",
        "go</action>",
        "<action>go</search>",
        "</action>go<action>",
        "<act>x</act>",
        "< action>x</action>",
    ],
)
def test_find_action_block_none(text: str) -> None:
    assert find_action_block(text) is None


def test_find_action_block_custom_tags() -> None:
    assert find_action_block("<think>x</think><action>y</action>", tags=("think",)) == (0, 16)
    assert find_action_block("<search>q</search>", tags=("action",)) is None


@PROPERTY
@given(
    prefix=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="<")),
    block=tagged_block(),
    suffix=filler,
)
def test_find_action_block_finds_inserted_block(prefix: str, block: str, suffix: str) -> None:
    # Random bodies rarely hold a tag of the block's own name; such a body makes a different block.
    assume(find_action_block(block) == (0, len(block)))
    assert find_action_block(prefix + block + suffix) == (len(prefix), len(prefix) + len(block))


# --- locate_action_span: per-token decoding (A.3 step 1) -----------------------------------------------


@PROPERTY
@given(prefix=filler, block=tagged_block(), suffix=filler, add_eos=st.booleans())
def test_span_covers_block_minimally(embedded_tokenizer, prefix, block, suffix, add_eos) -> None:
    ids = encode(embedded_tokenizer, prefix + block + suffix)
    # The response text is what the ids decode to: SmolLM2's vocabulary lacks a few byte tokens, so rare
    # characters do not round-trip, while the ASCII tags always do.
    text = decode(embedded_tokenizer, ids)
    if add_eos:
        ids.append(embedded_tokenizer.eos_token_id)
    char_span = find_action_block(text)
    assert char_span is not None  # the inserted block, or an earlier one the random filler happened to form
    span = locate_action_span(embedded_tokenizer, ids)
    assert_minimal_cover(embedded_tokenizer, ids, span, text[char_span[0] : char_span[1]])


@PROPERTY
@given(prefix=filler, block=tagged_block(), suffix=filler)
def test_span_with_one_token_per_character(embedded_tokenizer, prefix, block, suffix) -> None:
    # Sampling can produce non-canonical tokenizations; here every character (tags too) is its own token run.
    ids = [token for char in prefix + block + suffix for token in encode(embedded_tokenizer, char)]
    text = decode(embedded_tokenizer, ids)
    char_span = find_action_block(text)
    span = locate_action_span(embedded_tokenizer, ids)
    assert_minimal_cover(embedded_tokenizer, ids, span, text[char_span[0] : char_span[1]])


@PROPERTY
@given(
    text=filler,
    unclosed=st.one_of(st.just(""), tag_names.map(lambda t: f"<{t}>"), tag_names.map(lambda t: f"</{t}>")),
    tail=filler,
)
def test_no_complete_block_gives_empty_span(embedded_tokenizer, text, unclosed, tail) -> None:
    full = text + unclosed + tail
    assume(find_action_block(full) is None)
    ids = encode(embedded_tokenizer, full) + [embedded_tokenizer.eos_token_id]
    assert locate_action_span(embedded_tokenizer, ids, response_text=full) == EMPTY_SPAN


@pytest.mark.parametrize(
    ("text", "block"),
    [
        ("a<answer>b</answer>.", "<answer>b</answer>"),  # ">." is one token: tag merged with text after it
        ("go <ACTION>\nopen drawer 1</Action>\n", "<ACTION>\nopen drawer 1</Action>"),  # " <" merges the space
        ("think</think>\n<action>go</action>", "<action>go</action>"),
        ("<search>é漢字🙂</search>", "<search>é漢字🙂</search>"),  # multi-byte characters split across tokens
        ("x<action><action>y</action>", "<action>y</action>"),
    ],
)
def test_span_hand_cases(embedded_tokenizer, text: str, block: str) -> None:
    ids = encode(embedded_tokenizer, text) + [embedded_tokenizer.eos_token_id]
    span = locate_action_span(embedded_tokenizer, ids)
    assert_minimal_cover(embedded_tokenizer, ids, span, block)


def test_span_includes_merged_edge_tokens(embedded_tokenizer) -> None:
    ids = encode(embedded_tokenizer, "go <action>x</action>.")
    pieces = [decode(embedded_tokenizer, [i]) for i in ids]
    start, end = locate_action_span(embedded_tokenizer, ids)
    assert pieces[start] == " <" and pieces[end - 1] == ">."


def test_span_accepts_tensor_and_trailing_special_tokens(embedded_tokenizer) -> None:
    tok = embedded_tokenizer
    ids = encode(tok, "<action>look</action>")
    padded = torch.tensor(ids + [tok.eos_token_id, tok.pad_token_id, tok.pad_token_id])
    assert locate_action_span(tok, padded) == (0, len(ids))


@pytest.mark.parametrize("ids", [[], [-100, 5], [10**30], [1.5]])
def test_span_never_raises_on_bad_ids(embedded_tokenizer, ids) -> None:
    assert locate_action_span(embedded_tokenizer, ids, response_text="<action>x</action>") == EMPTY_SPAN


@PROPERTY
@given(ids=st.lists(st.integers(0, 49151), max_size=30), text=st.one_of(st.none(), filler))
def test_span_is_always_in_range(embedded_tokenizer, ids, text) -> None:
    start, end = locate_action_span(embedded_tokenizer, ids, response_text=text)
    assert (start, end) == EMPTY_SPAN or 0 <= start < end <= len(ids)


# --- locate_action_span: retokenized fallback (A.3 step 2) ---------------------------------------------


def test_fallback_finds_block_without_leading_space(embedded_tokenizer) -> None:
    text = "I should look.\n<action>go to fridge 1</action>"
    ids = encode(embedded_tokenizer, text) + [embedded_tokenizer.eos_token_id]
    block_ids = encode(embedded_tokenizer, "<action>go to fridge 1</action>")
    start, end = locate_action_span(PieceBlindTokenizer(embedded_tokenizer), ids, response_text=text)
    assert ids[start:end] == block_ids


def test_fallback_finds_block_with_leading_space(embedded_tokenizer) -> None:
    text = "go <search>capital of France</search>"
    ids = encode(embedded_tokenizer, text)
    start, end = locate_action_span(PieceBlindTokenizer(embedded_tokenizer), ids, response_text=text)
    assert decode(embedded_tokenizer, ids[start:end]) == " <search>capital of France</search>"


def test_fallback_uses_recorded_text_that_differs_from_decode(embedded_tokenizer) -> None:
    # A backend may record text with extra context (here a prefix the ids lack); only the block must match.
    ids = encode(embedded_tokenizer, "<answer>Paris</answer>")
    recorded = "Thinking done. <answer>Paris</answer>"
    blind = PieceBlindTokenizer(embedded_tokenizer)
    assert locate_action_span(blind, ids, response_text=recorded) == (0, len(ids))
    assert locate_action_span(blind, ids, response_text="<answer>Rome</answer>") == EMPTY_SPAN
    assert locate_action_span(blind, ids, response_text="no block") == EMPTY_SPAN
    assert locate_action_span(blind, ids) == EMPTY_SPAN


@PROPERTY
@given(prefix=filler, block=tagged_block(), suffix=filler)
def test_fallback_is_exact_or_empty(embedded_tokenizer, prefix, block, suffix) -> None:
    ids = encode(embedded_tokenizer, prefix + block + suffix)
    text = decode(embedded_tokenizer, ids)
    start, end = locate_action_span(PieceBlindTokenizer(embedded_tokenizer), ids, response_text=text)
    if (start, end) != EMPTY_SPAN:
        char_start, char_end = find_action_block(text)
        assert decode(embedded_tokenizer, ids[start:end]).removeprefix(" ") == text[char_start:char_end]


# --- parse_action -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>hmm</think>\n<action> go to fridge 1 </action>", ParsedAction("go to fridge 1", True, "ok")),
        ("<ACTION>\nopen drawer 1\n</Action>", ParsedAction("open drawer 1", True, "ok")),
        ("I will look around.", ParsedAction("", False, "no_tag")),
        ("", ParsedAction("", False, "no_tag")),
        ("go</action>", ParsedAction("", False, "no_tag")),
        ("<action>look</action><action>go</action>", ParsedAction("", False, "multiple_tags")),
        ("<action>a<action>b</action>", ParsedAction("", False, "multiple_tags")),
        ("<action>look", ParsedAction("", False, "unclosed")),
        ("</action>look<action>", ParsedAction("", False, "unclosed")),
        ("<action>  \n </action>", ParsedAction("", False, "empty")),
    ],
)
def test_parse_action_cases(text: str, expected: ParsedAction) -> None:
    assert parse_action(text) == expected


def test_parse_action_other_tag() -> None:
    assert parse_action("<search>who</search>", tag="search") == ParsedAction("who", True, "ok")
    assert parse_action("<search>who</search>") == ParsedAction("", False, "no_tag")


@PROPERTY
@given(
    prefix=st.text(st.characters(exclude_characters="<")),
    inner=st.text(st.characters(exclude_characters="<")),
    suffix=st.text(st.characters(exclude_characters="<")),
    name=any_case("action"),
)
def test_parse_action_extracts_stripped_content(prefix, inner, suffix, name) -> None:
    parsed = parse_action(f"{prefix}<{name}>{inner}</action>{suffix}")
    if inner.strip():
        assert parsed == ParsedAction(inner.strip(), True, "ok")
    else:
        assert parsed == ParsedAction("", False, "empty")


@PROPERTY
@given(
    text=st.lists(st.one_of(st.sampled_from(["<action>", "</action>", "<ACTION>", " "]), st.characters())).map("".join)
)
def test_parse_action_never_raises(text: str) -> None:
    parsed = parse_action(text)
    assert parsed.valid == (parsed.reason == "ok")
    assert parsed.valid or parsed.action == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think><search> who  </search>", ParsedAction("<search>who</search>", True, "ok")),
        ("<Answer>Paris</Answer> <search>q</search>", ParsedAction("<answer>Paris</answer>", True, "ok")),
        ("no block at all", ParsedAction("", False, "no_tag")),
        ("<search>   </search>", ParsedAction("", False, "empty")),
        ("<search>unclosed", ParsedAction("", False, "no_tag")),
    ],
)
def test_parse_env_action_with_several_tags(text: str, expected: ParsedAction) -> None:
    assert parse_env_action(text, ("search", "answer")) == expected


def test_parse_env_action_with_one_tag_is_parse_action() -> None:
    text = "<action>go to desk 1</action>"
    assert parse_env_action(text, ("action",)) == parse_action(text) == ParsedAction("go to desk 1", True, "ok")
