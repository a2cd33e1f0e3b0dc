"""Exact match after SQuAD normalisation, the Search-R1 reward."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop ASCII punctuation and the articles a/an/the, collapse whitespace (SQuAD's rule)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0."""
    predicted = normalize_answer(prediction)
    if not predicted:  # "the", "..." or "" must not match anything, whatever the gold list holds
        return 0.0
    return float(any(predicted == normalize_answer(gold) for gold in golden_answers))
