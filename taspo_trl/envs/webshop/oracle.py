"""A scripted policy that knows the goal: for tests, smoke runs and demonstrations.

It searches with the goal's product query and attributes, pages through the results until the goal's product
shows up (searching its full title instead when it does not), opens it, clicks each goal option value and
buys. It reads only the admissible commands, so it plays the embedded site and a WebShop server alike.
``WebShopExpert`` adds a rationale to each action, for demonstrations on the embedded site.
"""

from __future__ import annotations

import random
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


class WebShopExpert:
    """The oracle as the expert of one episode: ``expert(observation, admissible, rng) -> (thought, action)``,
    each action explained by what the page offers and what the instruction asks for."""

    def __init__(self, spec: Mapping[str, Any], env: Any) -> None:
        goal = getattr(env, "goal", None)
        if not isinstance(goal, Mapping):
            raise ValueError(
                "The WebShop expert needs the goal's product and options, which only the embedded site has; "
                "build demonstrations on the embedded shop (no `url`)."
            )
        self.goal = goal
        self.policy = OraclePolicy(goal)

    def __call__(self, observation: str, admissible: list[str] | None, rng: random.Random) -> tuple[str, str]:
        action = self.policy(list(admissible or []))
        pick = rng.choice
        value = action[len("click[") : -1] if action.startswith("click[") else ""
        wanted = self.goal.get("query", "the product")
        if action.startswith("search["):
            thought = pick((
                f"I should search for {wanted} with the attributes the instruction lists.",
                f"The shop has a search box; a query for {wanted} and its features should find the item.",
            ))
        elif value == str(self.goal["asin"]).lower():
            thought = pick((
                f"Result {value.upper()} looks like the {wanted} that was asked for; I open it.",
                f"This listing, {value.upper()}, matches the request, so I look at it.",
            ))
        elif value == BUY_NOW:
            thought = pick((
                "Every option the instruction asks for is selected, so I buy it now.",
                "The item and its options match the request; time to buy.",
            ))
        elif value == NEXT_PAGE:
            thought = pick((
                f"No {wanted} that fits is on this page; I go to the next one.",
                "The item I need is not among these results, so I check the next page.",
            ))
        elif value == BACK_TO_SEARCH:
            thought = "These results do not have it; I go back and search again."
        else:
            thought = pick((
                f"The instruction asks for {value}, so I select that option.",
                f"I need the {value} option; I click it.",
            ))
        return thought, action
