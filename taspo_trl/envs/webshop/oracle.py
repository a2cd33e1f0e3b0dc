"""A scripted policy that knows the goal: for tests, smoke runs and demonstrations.

It searches with the goal's product query and attributes, pages through the results until the goal's product
shows up (searching its full title instead when it does not), opens it, clicks each goal option value and
buys. It reads only the admissible commands, so it plays the embedded site and a WebShop server alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .env import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, SEARCH_COMMAND


class OraclePolicy:
    """``policy(admissible_commands) -> action`` for one episode of ``goal`` (a goal dict with ``asin``)."""

    def __init__(self, goal: Mapping[str, Any], title: str | None = None) -> None:
        self.goal = goal
        self._queries = [" ".join([goal["query"], *goal.get("attributes", [])]), title or goal.get("name", "")]
        self._searches = 0
        self._clicked: set[str] = set()

    def __call__(self, admissible: list[str]) -> str:
        product = f"click[{str(self.goal['asin']).lower()}]"
        if SEARCH_COMMAND in admissible:
            query = self._queries[min(self._searches, len(self._queries) - 1)]
            self._searches += 1
            return f"search[{query}]"
        if product in admissible:
            self._clicked.clear()
            return product
        if f"click[{BUY_NOW}]" in admissible:
            for value in _option_values(self.goal):
                action = f"click[{value}]"
                if action in admissible and value not in self._clicked:
                    self._clicked.add(value)
                    return action
            return f"click[{BUY_NOW}]"
        if f"click[{NEXT_PAGE}]" in admissible:
            return f"click[{NEXT_PAGE}]"
        return f"click[{BACK_TO_SEARCH}]"


def _option_values(goal: Mapping[str, Any]) -> list[str]:
    options = goal.get("goal_options", {})
    values = options.values() if isinstance(options, Mapping) else options
    return [str(v).lower() for v in values]


def play(env: Any, policy: Any) -> tuple[float, dict[str, Any]]:
    """Run ``policy(admissible) -> action`` on a freshly reset ``env``; returns the final reward and info."""
    env.reset()
    reward, info = 0.0, {}
    for _ in range(env.max_turns):
        _, reward, done, info = env.step(policy(env.admissible_commands))
        if done:
            break
    return reward, info
