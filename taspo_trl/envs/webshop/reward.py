"""WebShop's purchase reward, reimplemented without spaCy or thefuzz.

The structure is WebShop's (``web_agent_site/engine/goal.py``)::

    score = r_type * (attribute matches + option matches + [price <= limit]) / (#goal attributes + #goal options + 1)

- ``r_type``: 1.0 when the bought product's query equals the goal's, or at least two levels of their category
  paths coincide, or more than a fifth of the goal title's nouns appear among the bought title's nouns; 0.5
  when none of these hold; 0.1 when under a tenth of the nouns match; 0.0 when none do.
- An attribute matches when it matches one of the product's attributes, or occurs in its title, features or
  description.
- A chosen option matches when it equals a goal option (sizes, exactly) or matches one fuzzily (the others), or
  occurs in the product's title, features or description.

Differences from WebShop, all deliberate:

- Nouns: WebShop POS-tags both titles with spaCy; our products carry the nouns their generator put in the title
  (``"nouns"``: the product type's nouns and the brand). For goals without ``nouns`` we fall back to the title's
  words minus a small stop list.
- Fuzzy matching: WebShop accepts ``fuzz.token_set_ratio > 85``; we accept when one side's word set contains the
  other's (where ``token_set_ratio`` is 100), which is the case that matters for short attribute phrases.
- Colours: WebShop first maps colour variants to base colours (``normalize_color``); we compare as written.
- Option matches are capped at the number of goal options, so a product with more option groups than the goal
  cannot score above 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

EXACT_MATCH_OPTIONS = ("size",)
_WORD = re.compile(r"[a-z0-9]+(?:[-'.][a-z0-9]+)*")
_NOT_NOUNS = frozenset(
    ["a", "an", "and", "the", "for", "with", "of", "in", "on", "to", "by", "from", "-", "set", "pack", "free"]
)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _fuzzy_match(a: str, b: str) -> bool:
    left, right = _words(a), _words(b)
    return bool(left and right) and (left <= right or right <= left)


def _nouns(record: Mapping[str, Any], title_key: str) -> set[str]:
    if record.get("nouns"):
        return {str(n).lower() for n in record["nouns"]}
    return {w for w in _words(str(record.get(title_key, ""))) if w not in _NOT_NOUNS and not w.isdigit()}


def type_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> float:
    """r_type: how well the bought product's kind matches the goal's (1.0, 0.5, 0.1 or 0.0)."""
    query_match = product.get("query") == goal.get("query")
    product_path = {level.strip() for level in str(product.get("product_category", "")).split("›")}
    goal_path = {level.strip() for level in str(goal.get("product_category", "")).split("›")}
    category_match = len((product_path & goal_path) - {""}) >= 2
    wanted = _nouns(goal, "name")
    # WebShop's neutral 0.2 when the goal title has no nouns at all.
    title_score = len(_nouns(product, "Title") & wanted) / len(wanted) if wanted else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def _in_text(phrase: str, product: Mapping[str, Any]) -> bool:
    phrase = phrase.lower()
    return (
        phrase in str(product.get("Title", "")).lower()
        or phrase in " ".join(product.get("BulletPoints", [])).lower()
        or phrase in str(product.get("Description", "")).lower()
    )


def attribute_matches(product: Mapping[str, Any], goal: Mapping[str, Any]) -> int:
    """How many goal attributes the product has (its attribute list first, then its texts)."""
    count = 0
    for wanted in goal.get("attributes", []):
        if any(_fuzzy_match(have, wanted) for have in product.get("Attributes", [])) or _in_text(wanted, product):
            count += 1
    return count


def option_matches(product: Mapping[str, Any], goal_options: list[str], chosen: Mapping[str, str]) -> int:
    """How many chosen options match a goal option (WebShop counts over the chosen ones), capped."""
    wanted = [str(v).lower() for v in goal_options]
    count = 0
    for name, value in chosen.items():
        value = str(value).lower()
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = value in wanted
        else:
            matched = any(_fuzzy_match(option, value) for option in wanted)
        if matched or _in_text(value, product):
            count += 1
    return min(count, len(wanted))


def purchase_reward(product: Mapping[str, Any], goal: Mapping[str, Any], price: float,
                    options: Mapping[str, str], verbose: bool = False) -> float | tuple[float, dict[str, Any]]:
    """The score in [0, 1] of buying ``product`` at ``price`` with ``options`` chosen, for ``goal``.

    ``goal`` holds ``attributes`` (list), ``goal_options`` (dict or list of values), ``price_upper``,
    ``query``, ``product_category`` and ``nouns`` or ``name``. With ``verbose`` also returns the parts.
    """
    goal_options = goal.get("goal_options", {})
    option_values = list(goal_options.values()) if isinstance(goal_options, Mapping) else list(goal_options)
    r_type = type_reward(product, goal)
    n_attr = attribute_matches(product, goal)
    n_option = option_matches(product, option_values, options)
    price_ok = float(price) <= float(goal.get("price_upper", 0)) if float(goal.get("price_upper", 0)) > 0 else False
    total = (n_attr + n_option + int(price_ok)) / (len(goal.get("attributes", [])) + len(option_values) + 1)
    score = r_type * total
    if verbose:
        return score, {"r_type": r_type, "attribute_matches": n_attr, "option_matches": n_option, "price_ok": price_ok}
    return score
