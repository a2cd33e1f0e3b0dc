"""Locating the action block of a response, in characters and in tokens, and parsing the action out of it.

TASPO (Appendix A.3) scores the policy's action, not its reasoning: the "action span" of a turn is the first
complete block of one of the environment's action tags (``<action>``; Search-QA's ``<search>`` or
``<answer>``), tags included; without tags, any of ``ACTION_TAGS``. Its token span is found in two
steps. First, each response token is decoded on its own and the tokens whose text overlaps the block found in
the concatenation are taken. If that text has no block, the recorded response text is searched instead, and
the matched block is tokenized (with and without one leading space) and located as an exact subsequence of the
response tokens. When neither works the span is empty, and so is the turn's action mask.

Model output is often malformed; nothing here raises on it.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from ..envs.base import ACTION_TAGS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EMPTY_SPAN: tuple[int, int] = (0, 0)


@lru_cache(maxsize=64)
def _block_pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    """``<tag>...</tag>`` for any of ``tags``, closing tag with the same name, any case, across lines.

    The body may not contain another opening tag of the same name, so in ``<a>x<a>y</a>`` the block is the
    complete inner ``<a>y</a>`` rather than a span that swallows a stray opening tag.
    """
    names = "|".join(re.escape(tag) for tag in tags)
    return re.compile(rf"<({names})>((?:(?!<\1>).)*?)</\1>", re.IGNORECASE | re.DOTALL)


def find_action_block(text: str, tags: Sequence[str] = ACTION_TAGS) -> tuple[int, int] | None:
    """Character span ``[start, end)`` of the first complete tagged block in ``text``, both tags included.

    ``None`` when there is no block with a matching closing tag (missing or unclosed tags).
    """
    match = _block_pattern(tuple(tags)).search(text)
    return match.span() if match else None


def locate_action_span(
    tokenizer: PreTrainedTokenizerBase,
    response_ids: Sequence[int],
    response_text: str | None = None,
    tags: Sequence[str] = ACTION_TAGS,
) -> tuple[int, int]:
    """Token span ``[start, end)`` of ``response_ids`` covering the first action block, tags included.

    ``response_ids`` may be a list or a 1-D tensor and may end in special tokens (EOS, padding).
    ``response_text`` is the text recorded for the response (e.g. by the generation backend); it is only
    consulted when the per-token decoding has no block. Returns :data:`EMPTY_SPAN` ``(0, 0)`` when the block
    cannot be located.
    """
    ids = response_ids.tolist() if hasattr(response_ids, "tolist") else list(response_ids)
    if not ids:
        return EMPTY_SPAN
    tags = tuple(tags)
    try:
        span = _span_from_token_pieces(tokenizer, ids, tags)
        if span is None and response_text:
            span = _span_from_retokenized_block(tokenizer, ids, response_text, tags)
    except (TypeError, ValueError, IndexError, OverflowError):
        # Ids the tokenizer cannot decode (e.g. -100 labels, out-of-vocabulary ids) are a caller bug, but the
        # rollout must go on: the turn simply gets no action span.
        return EMPTY_SPAN
    return span or EMPTY_SPAN


def _span_from_token_pieces(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], tags: tuple[str, ...]
) -> tuple[int, int] | None:
    """Step 1 of A.3: tokens whose individually decoded text overlaps the block in the concatenated pieces.

    Decoding tokens one by one keeps a 1:1 map from characters to tokens. The tags are ASCII, so they survive
    intact even where a multi-byte character split across tokens decodes as replacement characters.
    """
    pieces = tokenizer.batch_decode(
        [[token_id] for token_id in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    ends: list[int] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        ends.append(total)
    block = find_action_block("".join(pieces), tags)
    if block is None:
        return None
    char_start, char_end = block
    starts = [0, *ends[:-1]]
    # First token ending after the block starts; one past the last token starting before it ends. Tokens that
    # decode to nothing never count as overlapping at the edges.
    return bisect_right(ends, char_start), bisect_left(starts, char_end)


def _span_from_retokenized_block(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], response_text: str, tags: tuple[str, ...]
) -> tuple[int, int] | None:
    """Step 2 of A.3: tokenize the block found in ``response_text`` and find it verbatim in ``ids``.

    The leading-space variant covers BPE vocabularies that merge the space before ``<`` into the tag's token.
    """
    block = find_action_block(response_text, tags)
    if block is None:
        return None
    block_text = response_text[block[0] : block[1]]
    for candidate in (block_text, " " + block_text):
        needle = tokenizer(candidate, add_special_tokens=False)["input_ids"]
        start = _find_subsequence(ids, needle)
        if start is not None:
            return start, start + len(needle)
    return None


def _find_subsequence(haystack: list[int], needle: list[int]) -> int | None:
    """Index of the first occurrence of ``needle`` in ``haystack``, or ``None``."""
    if not needle:
        return None
    first, width = needle[0], len(needle)
    for i in range(len(haystack) - width + 1):
        if haystack[i] == first and haystack[i : i + width] == needle:
            return i
    return None


@dataclass(frozen=True)
class ParsedAction:
    """The action extracted from a response.

    ``reason`` is ``"ok"`` for a valid action, else why it is invalid: ``"no_tag"`` (no opening tag),
    ``"multiple_tags"`` (more than one opening or closing tag), ``"unclosed"`` (the opening tag is not
    followed by its closing tag) or ``"empty"`` (only whitespace between the tags). ``action`` is ``""``
    whenever ``valid`` is false.
    """

    action: str
    valid: bool
    reason: str


def parse_env_action(text: str, tags: Sequence[str]) -> ParsedAction:
    """The action an environment receives: with one tag, the block's content (:func:`parse_action`); with
    several (Search-QA's ``search``/``answer``), the first complete block of any of them in canonical form,
    ``"<search>query</search>"``, so the environment knows which kind of action it got."""
    if len(tags) == 1:
        return parse_action(text, tag=tags[0])
    match = _block_pattern(tuple(tags)).search(text)
    if match is None:
        return ParsedAction("", False, "no_tag")
    content = match.group(2).strip()
    if not content:
        return ParsedAction("", False, "empty")
    tag = match.group(1).lower()
    return ParsedAction(f"<{tag}>{content}</{tag}>", True, "ok")


def parse_action(text: str, tag: str = "action") -> ParsedAction:
    """Extract the stripped content of exactly one ``<tag>...</tag>`` block (tag name in any case)."""
    opening = re.compile(rf"<{re.escape(tag)}>", re.IGNORECASE)
    closing = re.compile(rf"</{re.escape(tag)}>", re.IGNORECASE)
    opens = list(opening.finditer(text))
    closes = list(closing.finditer(text))
    if not opens:
        return ParsedAction("", False, "no_tag")
    if len(opens) > 1 or len(closes) > 1:
        return ParsedAction("", False, "multiple_tags")
    if not closes or closes[0].start() < opens[0].end():
        return ParsedAction("", False, "unclosed")
    action = text[opens[0].end() : closes[0].start()].strip()
    if not action:
        return ParsedAction("", False, "empty")
    return ParsedAction(action, True, "ok")
