"""WebShop in text mode: one shopping episode, on the embedded catalogue or on a running WebShop server.

Pages, clickables and actions follow WebShop's text environment (``WebAgentTextEnv`` in simple mode): the page
is its visible texts joined with `` [SEP] ``; actions are ``search[query]`` (on the search page, the only one
with a search box) and ``click[target]`` where the target is one of the page's clickables, lowercased: buttons
(``back to search``, ``next >``, ``< prev``, ``description``, ``features``, ``reviews``, ``buy now``), product
ids on a results page, option values on an item page. ``click[buy now]`` ends the episode with the purchase
score. Anything else, including a missing action, is answered with the unchanged page after a one-line
"Invalid action: ..." (WebShop itself answers with the unchanged page alone).

Departures from WebShop's text environment: search only works where the page has a search box (WebShop runs a
search from any page); each page omits the instruction block except the search page (the agent prompt already
shows the task); an item page starts with "You have clicked VALUE." for each chosen option (WebShop's rich text
mode does this, its simple mode does not).
"""

from __future__ import annotations

import re
from typing import Any

from ..base import StepResult, normalize_command
from .catalog import PRODUCT_WINDOW, Catalog
from .reward import purchase_reward

SEP = " [SEP] "
SEARCH_COMMAND = "search[<your query>]"
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features", "reviews")
MAX_QUERY_CHARS = 200
INSTRUCTIONS = (
    "Act with search[keywords] on the search page (e.g. <action>search[black hair dryer]</action>) and "
    "click[target] with one of the page's clickables (e.g. <action>click[buy now]</action>). On a product "
    "page click each wanted option value before click[buy now]; buying ends the episode."
)
_ACTION = re.compile(r"\s*([A-Za-z_]+)\s*\[(.*)\]\s*", re.DOTALL)


def parse_action(action: str) -> tuple[str, str | None]:
    """``"click[Buy Now]"`` -> ``("click", "Buy Now")``; text without brackets -> ``(text, None)``."""
    match = _ACTION.fullmatch(action)
    if match is None:
        return action.strip(), None
    return match.group(1), match.group(2)


class SiteError(Exception):
    """The site could not produce the next page (e.g. the WebShop server is down)."""


class WebShopEpisode:
    """Turn counting, action parsing and invalid-action answers shared by the embedded and server sites.

    Subclasses implement the site: ``_open`` (the search page), ``_search``, ``_click`` (returns the score
    when the click bought something), ``_page``, ``_clickables`` and ``_has_search_bar``. They raise
    :class:`SiteError` for a site failure, which ends the episode with an error observation.
    """

    action_tag = "action"
    env_name = "webshop"
    instructions = INSTRUCTIONS

    def __init__(self, instruction: str, task_type: str, max_turns: int = 15) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.task_type = task_type
        self._instruction = instruction
        self._started = False
        self._done = False
        self._truncated = False
        self._turns = 0
        self._score = 0.0
        self._error: str | None = None
        self._last_observation = ""

    @property
    def task(self) -> str:
        """The shopping instruction, e.g. "i need a long lasting hair dryer ..., and price lower than 40.00 dollars"."""
        return self._instruction

    @property
    def turns(self) -> int:
        return self._turns

    @property
    def error(self) -> str | None:
        """Why the site failed (the episode then ended), or None."""
        return self._error

    @property
    def admissible_commands(self) -> list[str]:
        """``search[<your query>]`` where the page has a search box, then ``click[...]`` per clickable."""
        if self._done or not self._started:
            return []
        search = [SEARCH_COMMAND] if self._has_search_bar() else []
        return search + [f"click[{c}]" for c in self._clickables()]

    def reset(self) -> str:
        """Open the search page; returns it (with the instruction)."""
        self._started, self._done, self._truncated, self._turns = True, False, False, 0
        self._score, self._error = 0.0, None
        try:
            self._open()
            self._last_observation = self._page()
        except SiteError as error:
            self._fail(error)
        return self._last_observation

    def step(self, action: str) -> StepResult:
        """Play one ``search[...]``/``click[...]`` action; never raises for any text."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return StepResult(self._last_observation, 0.0, True, self._info())
        self._turns += 1
        reward = 0.0
        try:
            problem = self._act(action if isinstance(action, str) else "")
            if problem is not None:
                self._last_observation = f"Invalid action: {problem}.\n{self._page()}"
            elif self._done:
                reward = self._score
            else:
                self._last_observation = self._page()
        except SiteError as error:
            self._fail(error)
        self._truncated = not self._done and self._turns >= self.max_turns
        self._done = self._done or self._truncated
        return StepResult(self._last_observation, reward, self._done, self._info())

    def _act(self, action: str) -> str | None:
        """Carry out ``action``; returns why it is invalid, or None."""
        name, argument = parse_action(action)
        if argument is None:
            if not name:
                return "no action given; answer with search[keywords] or click[target]"
            return f"{_clip(name)!r} is not an action; write search[keywords] or click[target]"
        if name not in ("search", "click"):
            hint = f"; write {name.lower()}[...]" if name.lower() in ("search", "click") else ""
            return f"unknown action {_clip(name)!r}{hint}"
        if name == "search":
            query = " ".join(argument.split())[:MAX_QUERY_CHARS].lower()
            if not self._has_search_bar():
                return "there is no search box on this page; click[back to search] first"
            if not query:
                return "the search query is empty"
            self._search(query)
            return None
        target = normalize_command(argument)
        if not target:
            return "click needs a target, e.g. click[buy now]"
        if target not in self._clickables():
            return f"{_clip(target)!r} is not clickable on this page"
        score = self._click(target)
        if score is not None:
            self._done, self._score = True, score
            self._last_observation = self._page()
        return None

    def _fail(self, error: SiteError) -> None:
        self._done, self._score, self._error = True, 0.0, str(error)
        self._last_observation = f"WebShop error: {error}. The episode has ended."

    def _info(self) -> dict[str, Any]:
        info = {
            "won": self._done and self._score >= 1.0 - 1e-9,
            "score": self._score,
            "truncated": self._truncated,
            "turn": self._turns,
            "admissible_commands": self.admissible_commands,
        }
        if self._error is not None:
            info["error"] = self._error
        return info

    def close(self) -> None:
        """Nothing to release: pages live in memory or behind stateless HTTP requests."""

    # The site, implemented by subclasses.
    def _open(self) -> None:
        raise NotImplementedError

    def _search(self, query: str) -> None:
        raise NotImplementedError

    def _click(self, target: str) -> float | None:
        raise NotImplementedError

    def _page(self) -> str:
        raise NotImplementedError

    def _clickables(self) -> list[str]:
        raise NotImplementedError

    def _has_search_bar(self) -> bool:
        raise NotImplementedError


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class WebShopEnv(WebShopEpisode):
    """One episode on the embedded catalogue: the site's pages are rendered from :class:`Catalog` in memory."""

    def __init__(self, goal: dict[str, Any], catalog: Catalog, max_turns: int = 15) -> None:
        super().__init__(goal["instruction_text"], goal.get("category", "webshop"), max_turns)
        self.goal = goal
        self.catalog = catalog
        self._kind = "home"
        self._results: list[dict[str, Any]] = []
        self._results_page = 1
        self._asin: str | None = None
        self._options: dict[str, str] = {}
        self._sub_page = ""
        self.purchase: dict[str, Any] | None = None

    def _open(self) -> None:
        self._kind, self._results, self._asin, self._options = "home", [], None, {}
        self.purchase = None

    def _search(self, query: str) -> None:
        self._kind, self._results_page = "results", 1
        self._results = self.catalog.search(query)

    def _shown(self) -> list[dict[str, Any]]:
        start = (self._results_page - 1) * PRODUCT_WINDOW
        return self._results[start : start + PRODUCT_WINDOW]

    def _option_groups(self) -> dict[str, str]:
        """Option value -> its group on the current item page (the first group wins, as in WebShop's dict)."""
        groups: dict[str, str] = {}
        for group, values in self.catalog.by_asin[self._asin]["options"].items():
            for value in values:
                groups.setdefault(value, group)
        return groups

    def _has_search_bar(self) -> bool:
        return self._kind == "home"

    def _clickables(self) -> list[str]:
        if self._kind == "results":
            navigation = [BACK_TO_SEARCH]
            navigation += [PREV_PAGE] if self._results_page > 1 else []
            navigation += [NEXT_PAGE] if self._results_page * PRODUCT_WINDOW < len(self._results) else []
            return navigation + [p["asin"].lower() for p in self._shown()]
        if self._kind == "item":
            return [BACK_TO_SEARCH, PREV_PAGE, *self._option_groups(), *SUB_PAGES, BUY_NOW]
        if self._kind == "sub":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def _click(self, target: str) -> float | None:
        if target == BACK_TO_SEARCH:
            self._open()
        elif self._kind == "results" and target in (NEXT_PAGE, PREV_PAGE):
            self._results_page += 1 if target == NEXT_PAGE else -1
        elif self._kind == "results":
            self._kind, self._asin, self._options = "item", target.upper(), {}
        elif self._kind == "item" and target == PREV_PAGE:
            self._kind = "results"
        elif self._kind == "item" and target in SUB_PAGES:
            self._kind, self._sub_page = "sub", target
        elif self._kind == "item" and target == BUY_NOW:
            return self._buy()
        elif self._kind == "item":
            self._options[self._option_groups()[target]] = target
        elif self._kind == "sub":  # only "< prev" is left
            self._kind = "item"
        return None

    def _info(self) -> dict[str, Any]:
        info = super()._info()
        if self.purchase is not None:  # what was bought and the reward's parts, for analysis
            info["purchase"] = dict(self.purchase)
        return info

    def _buy(self) -> float:
        product = self.catalog.by_asin[self._asin]
        score, parts = purchase_reward(product, self.goal, product["price"], self._options, verbose=True)
        self._kind = "done"
        self.purchase = {"asin": self._asin, "options": dict(self._options), "price": product["price"], **parts}
        return float(score)

    def _page(self) -> str:
        if self._kind == "home":
            return SEP.join(["WebShop", "Instruction:", self._instruction, "Search"])
        if self._kind == "results":
            clickables = self._clickables()
            texts = ["Back to Search", f"Page {self._results_page} (Total results: {len(self._results)})"]
            texts += ["< Prev"] if PREV_PAGE in clickables else []
            texts += ["Next >"] if NEXT_PAGE in clickables else []
            for product in self._shown():
                texts += [product["asin"], product["Title"], product["Price"]]
            return SEP.join(texts)
        product = self.catalog.by_asin.get(self._asin or "", {})
        if self._kind == "item":
            return render_item_page(product, self._options)
        if self._kind == "sub":
            return SEP.join(["Back to Search", "< Prev", *render_sub_page(product, self._sub_page)])
        return render_done_page(self._score)


def render_item_page(product: dict[str, Any], chosen: dict[str, str]) -> str:
    """The text of an item page, shared with the server adapter's tests."""
    texts = [f"You have clicked {value}." for value in chosen.values()]
    texts += ["Back to Search", "< Prev"]
    for group, values in product["options"].items():
        texts += [group, *values]
    texts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}",
              "Description", "Features", "Reviews", "Buy Now"]
    return SEP.join(texts)


def render_sub_page(product: dict[str, Any], sub_page: str) -> list[str]:
    """The body texts of the Description, Features or Reviews page."""
    if sub_page == "description":
        return [product["Description"]]
    if sub_page == "features":
        return list(product["BulletPoints"])
    if not product["Reviews"]:
        return ["There are no reviews yet."]
    return [f"{r['title']} ({r['score']} stars): {r['body']}" for r in product["Reviews"]]


def render_done_page(score: float) -> str:
    return SEP.join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{score:.4f}"])
