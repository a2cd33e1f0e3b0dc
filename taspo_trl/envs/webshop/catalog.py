"""The embedded catalogue, its goals and its BM25 search engine, loaded once per process and seed.

Seed 0 reads the shipped JSON files; other seeds are generated in memory. The ``bm25s`` index over each
product's text (title, query, category path, attributes, options, features) is built on first search; at a
few hundred products that takes milliseconds, so nothing is written to disk.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from .generator import SHIPPED_SEED, generate

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "webshop"
SEARCH_RETURN_N = 50  # WebShop's engine returns at most 50 hits ...
PRODUCT_WINDOW = 10  # ... shown 10 per page.
MAX_QUERY_WORDS = 32
_TOKEN = re.compile(r"\w+")
_STOPWORDS = frozenset([
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "i", "in", "is", "it", "me", "need", "of",
    "on", "or", "that", "the", "this", "to", "want", "with", "would", "like", "looking", "find", "get", "am",
    "price", "lower", "than", "dollars",
])


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without stop words (the instruction's filler words included)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS]


class Catalog:
    """Products by ASIN, goal splits, and BM25 search over the products."""

    def __init__(self, products: list[dict[str, Any]], goals: dict[str, list[dict[str, Any]]], seed: int) -> None:
        self.seed = seed
        self.products = products
        self.by_asin = {p["asin"]: p for p in products}
        self.goals = goals
        self._retriever = None

    def goal(self, split: str, index: int) -> dict[str, Any]:
        if split not in self.goals:
            raise ValueError(f"Unknown WebShop split {split!r}; the embedded splits are {sorted(self.goals)}.")
        goals = self.goals[split]
        if not 0 <= index < len(goals):
            raise ValueError(f"WebShop goal_index {index} is out of range for split {split!r} ({len(goals)} goals).")
        return goals[index]

    def _index(self):
        if self._retriever is None:
            import bm25s

            corpus = [tokenize(_product_text(p)) for p in self.products]
            retriever = bm25s.BM25()
            retriever.index(corpus, show_progress=False)
            self._retriever = retriever
        return self._retriever

    def search(self, query: str) -> list[dict[str, Any]]:
        """Up to ``SEARCH_RETURN_N`` products with a positive BM25 score, best first (ties by catalogue order)."""
        tokens = tokenize(query)[:MAX_QUERY_WORDS]
        if not tokens:
            return []
        scores = self._index().get_scores(tokens)
        ranked = sorted((i for i in range(len(scores)) if scores[i] > 0), key=lambda i: (-float(scores[i]), i))
        return [self.products[i] for i in ranked[:SEARCH_RETURN_N]]


def _product_text(product: dict[str, Any]) -> str:
    options = " ".join(v for values in product["options"].values() for v in values)
    return " ".join([
        product["Title"], product["query"], product["product_category"].replace("›", " "),
        " ".join(product["Attributes"]), options, " ".join(product["BulletPoints"]),
    ])


@functools.lru_cache(maxsize=4)
def load_catalog(seed: int = SHIPPED_SEED) -> Catalog:
    """The catalogue for ``seed``: the shipped files for seed 0, else generated (cached per process)."""
    if seed == SHIPPED_SEED and (DATA_DIR / "products.json").is_file():
        products = json.loads((DATA_DIR / "products.json").read_text())["products"]
        raw = json.loads((DATA_DIR / "goals.json").read_text())
        goals = {"eval": raw["eval"], "train": raw["train"]}
    else:
        products, goals = generate(seed)
    return Catalog(products, goals, seed)
