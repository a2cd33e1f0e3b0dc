"""Progress labels for WebShop actions: did the action bring the episode closer to buying the goal?

The distance of a state is the fewest steps to a purchase that scores 1: reach the goal product's page (paging
through the current results, stepping back from a product or sub-page, or going back to search and searching with
one of the oracle's queries, :class:`OraclePolicy`), click each goal option the page does not have chosen yet,
and buy. An action made progress when the distance after it is shorter than before it. After a wrong purchase,
or where the product cannot be found, there is no distance: an action into such a state made no progress, and an
action out of one is unknown (``None``). This is the WebShop counterpart of ALFWorld's planner distances
(``taspo_trl.envs.alfworld.progress``), for ``benchmarks/credit_quality.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .catalog import PRODUCT_WINDOW
from .env import WebShopEnv
from .oracle import OraclePolicy, _option_values


def _pages_to(results: Sequence[Mapping[str, Any]], asin: str) -> int | None:
    """The results page (from 1) that shows ``asin``, or ``None``."""
    for rank, product in enumerate(results):
        if product["asin"] == asin:
            return rank // PRODUCT_WINDOW + 1
    return None


def _via_search(env: WebShopEnv, asin: str) -> int | None:
    """Steps from the search page to the product's page with the oracle's best query: search, pages, click."""
    pages = [_pages_to(env.catalog.search(query), asin) for query in OraclePolicy(env.goal)._queries]
    found = [page for page in pages if page is not None]
    return 1 + (min(found) - 1) + 1 if found else None


def _to_product_page(env: WebShopEnv, asin: str) -> int | None:
    """Fewest steps from the current page to the goal product's item page."""
    back_and_search = None if (search := _via_search(env, asin)) is None else 1 + search
    if env._kind == "home":
        return _via_search(env, asin)
    if env._kind in ("item", "sub") and env._asin == asin:
        return 0 if env._kind == "item" else 1
    step_back = {"item": 1, "sub": 2}.get(env._kind, 0)  # "< prev" back to the results list
    page = _pages_to(env._results, asin)
    paging = None if page is None else step_back + abs(page - env._results_page) + 1
    options = [steps for steps in (paging, back_and_search) if steps is not None]
    return min(options) if options else None


def oracle_distance(env: WebShopEnv) -> int | None:
    """Fewest steps from ``env``'s current state to a purchase scoring 1 (0 after such a purchase)."""
    if env._kind == "done":
        return 0 if env._score == 1.0 else None
    asin = str(env.goal["asin"]).upper()
    reach = _to_product_page(env, asin)
    if reach is None:
        return None
    kept = env._options.values() if env._asin == asin and env._kind in ("item", "sub") else ()
    missing = [value for value in _option_values(env.goal) if value not in kept]
    return reach + len(missing) + 1


def webshop_distances(spec: Mapping[str, Any], commands: Sequence[str]) -> list[int | None]:
    """The distance before the first command and after each one, replayed on a fresh episode of ``spec`` (an
    embedded task spec); ``""`` stands for a turn without a valid action (the page stays)."""
    from . import webshop_env_factory

    env = webshop_env_factory({**spec, "max_turns": len(commands) + 1})
    if not isinstance(env, WebShopEnv):
        raise ValueError("WebShop progress labels need the embedded catalogue (a spec without 'url')")
    env.reset()
    distances = [oracle_distance(env)]
    for command in commands:
        if env._kind != "done":
            env.step(command)
        distances.append(oracle_distance(env))
    return distances


def webshop_progress(distances: Sequence[int | None]) -> list[bool | None]:
    """Per action: the distance went down (``True``), did not or became unknown (``False``), or was unknown before
    (``None``)."""
    return [
        None if before is None else (after is not None and after < before)
        for before, after in zip(distances[:-1], distances[1:])
    ]
