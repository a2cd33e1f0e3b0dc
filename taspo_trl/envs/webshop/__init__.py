"""WebShop (Yao et al., 2022) in text mode: an embedded, generated shop, or an adapter to a running WebShop site.

``webshop_env_factory(spec)`` builds one episode; ``webshop_task_rows(...)`` builds the dataset rows naming the
tasks. docs/webshop.md says what the pages, actions and reward are and how to run the official server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import encode_task_prompt
from .catalog import Catalog, load_catalog
from .env import INSTRUCTIONS, WebShopEnv, WebShopEpisode, parse_action
from .generator import SHIPPED_SEED, generate, write_data
from .oracle import OraclePolicy, play
from .reward import purchase_reward
from .server import WebShopServerEnv, fetch_instruction

DEFAULT_MAX_TURNS = 15
# The official app's goal order is fixed (shuffled with seed 233); its usual protocol tests on the first 500
# goals, validates on the next 1000 and trains on the rest.
SPLIT_ALIASES = {"test": "eval"}
OFFICIAL_SPLITS = {"eval": (0, 500), "test": (0, 500), "dev": (500, 1500), "train": (1500, 12087)}


def webshop_env_factory(spec: Mapping[str, Any]) -> WebShopEpisode:
    """The agent loop's ``EnvFactory``: one WebShop episode from a task spec.

    Keys: ``goal`` (a goal dict) or ``goal_index`` (into ``split``: "train" or "eval", default "train");
    ``url`` (a running WebShop site; None or absent = embedded); ``max_turns`` (15); ``seed`` (the embedded
    catalogue's generator seed, 0 = the shipped files); ``task`` and ``task_type`` (server mode: shown as given).
    """
    max_turns = int(spec.get("max_turns") or DEFAULT_MAX_TURNS)
    url = spec.get("url")
    if url:
        if "goal_index" not in spec:
            raise ValueError("A WebShop server task spec needs 'goal_index' (the server's goal number).")
        return WebShopServerEnv(str(url), int(spec["goal_index"]), max_turns=max_turns,
                                instruction=str(spec.get("task", "")), task_type=str(spec.get("task_type", "webshop")))
    catalog = load_catalog(int(spec.get("seed") or SHIPPED_SEED))
    if isinstance(spec.get("goal"), Mapping):
        goal = dict(spec["goal"])
        if goal.get("asin") not in catalog.by_asin:
            raise ValueError(f"WebShop goal names product {goal.get('asin')!r}, which is not in the catalogue.")
    elif "goal_index" in spec:
        split = str(spec.get("split", "train"))
        goal = catalog.goal(SPLIT_ALIASES.get(split, split), int(spec["goal_index"]))
    else:
        raise ValueError(f"WebShop task spec needs 'goal_index' or 'goal', got keys {sorted(spec)}.")
    return WebShopEnv(goal, catalog, max_turns=max_turns)


def webshop_task_rows(source: str = "embedded", split: str = "train", max_tasks: int | None = None, seed: int = 0,
                      url: str | None = None, max_turns: int = DEFAULT_MAX_TURNS) -> list[dict[str, Any]]:
    """Dataset rows ``{"prompt": <task spec as JSON>, "task_type": ...}``, one per goal of ``split``.

    ``source="embedded"``: the generated goals of ``seed`` ("train": 1072, "eval" or "test": the fixed 128).
    ``source="official"`` (implied by a ``url``): goals of the server at ``url`` (eval/test 0-499, dev
    500-1499, train 1500-); their instructions are read from the server now, so it must be running.
    """
    if url and source == "embedded":  # a configured server wins over the CLI's default source
        source = "official"
    split = SPLIT_ALIASES.get(split, split) if source == "embedded" else split
    if max_tasks is not None and max_tasks < 0:
        raise ValueError(f"max_tasks must be >= 0, got {max_tasks}")
    rows = []
    if source == "embedded":
        catalog = load_catalog(seed)
        goals = catalog.goals.get(split)
        if goals is None:
            raise ValueError(f"Unknown WebShop split {split!r}; the embedded splits are {sorted(catalog.goals)}.")
        for index, goal in enumerate(goals[:max_tasks]):
            spec = {"env": "webshop", "task": goal["instruction_text"], "goal_index": index, "split": split,
                    "seed": seed, "max_turns": max_turns, "task_type": goal["category"]}
            rows.append({"prompt": encode_task_prompt(spec), "task_type": goal["category"]})
        return rows
    if source != "official":
        raise ValueError(f"WebShop source must be 'embedded' or 'official', got {source!r}.")
    if not url:
        raise ValueError("source='official' needs url= (the running WebShop server, e.g. http://127.0.0.1:3000).")
    if split not in OFFICIAL_SPLITS:
        raise ValueError(f"Unknown WebShop split {split!r}; the official splits are {sorted(OFFICIAL_SPLITS)}.")
    first, end = OFFICIAL_SPLITS[split]
    end = min(end, first + max_tasks) if max_tasks is not None else end
    for index in range(first, end):
        spec = {"env": "webshop", "task": fetch_instruction(url, index), "goal_index": index, "url": url,
                "max_turns": max_turns, "task_type": "webshop"}
        rows.append({"prompt": encode_task_prompt(spec), "task_type": "webshop"})
    return rows


def webshop_rows_from_settings(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    """WebShop's ``TaskRowBuilder``: ``webshop_task_rows`` of the settings' ``task_source``, ``task_split``,
    ``max_tasks``, ``games_seed`` (the embedded catalogue's seed) and ``webshop_url``."""
    return webshop_task_rows(
        source=settings["task_source"],
        split=settings["task_split"],
        max_tasks=settings["max_tasks"],
        seed=settings["games_seed"],
        url=settings["webshop_url"],
        max_turns=max_turns or DEFAULT_MAX_TURNS,
    )


__all__ = [
    "INSTRUCTIONS",
    "SHIPPED_SEED",
    "Catalog",
    "OraclePolicy",
    "WebShopEnv",
    "WebShopEpisode",
    "WebShopServerEnv",
    "generate",
    "load_catalog",
    "parse_action",
    "play",
    "purchase_reward",
    "webshop_env_factory",
    "webshop_rows_from_settings",
    "webshop_task_rows",
    "write_data",
]
