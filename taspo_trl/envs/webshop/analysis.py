"""WebShop's rules for the rule-based analyzer (``analyzer: rule``), registered as ``"webshop"`` in
``taspo_trl.envs``: its ``search[...]`` / ``click[...]`` actions and the purchase path of each success."""

from __future__ import annotations

import re
from typing import Any

from ..analysis import ELLIPSIS, Candidate, Candidates, Step, add_candidate, effective_steps
from .env import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, SUB_PAGES
from .env import parse_action as parse_webshop_action

_WEBSHOP_BUTTONS = frozenset({BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW, *SUB_PAGES})
_RESULTS_PAGE = re.compile(r"Page \d+ \(Total results: \d+\)")
_WEBSHOP_INVALID = "invalid action"


def _webshop_command(action: str) -> tuple[str, str] | None:
    """("search", query) or ("click", target), lower-cased and whitespace-normalised; None for anything else."""
    name, argument = parse_webshop_action(action)
    if argument is None or name not in ("search", "click") or not argument.strip():
        return None
    return name, " ".join(argument.lower().split())


def _segments(page: str) -> list[str]:
    return [segment.strip() for segment in page.split("[SEP]")]


class WebShopRules:
    """From each success's purchase path: the last click[buy now], the product clicked on a results page
    before it, the option values clicked on its page in between, the search that listed it and any "next >"
    between that search and the product:
      requirements: search with the instruction's words (the successful queries, and the words they share),
          the product (its id and title), each option value;
      preconditions: paging to the product when it was not on the first results page; buying only on the
          product's page, after its options;
      ordering: the whole click path that bought the item.
    An item's anchors are the product ids and option values its source actions click: a target can only click
    what its pages showed. Searches and buttons anchor nothing (every episode starts at the search page)."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[Candidate]:
        candidates: Candidates = {}
        queries: dict[int, str] = {}
        for success in successes:
            path = self._purchase_path(effective_steps(success, _webshop_command, _WEBSHOP_INVALID))
            if path is None:
                continue
            search, pages, product, options, buy = path
            asin = product.command[1]
            title = self._title(product.pre, asin)
            shown = f"{asin.upper()}{f' ({title})' if title else ''}"
            queries[search.trajectory_id] = search.action
            add_candidate(candidates, ("search",), "requirement", "").support(search.trajectory_id, [search.reference([asin])])
            if pages:
                statement = (
                    f'{asin.upper()} is not on the first results page: click "next >" until it shows up '
                    f'("{pages[-1].action}").'
                )
                refs = [pages[-1].reference([asin]), product.reference([asin])]
                add_candidate(candidates, ("next_page", asin), "precondition", statement).support(product.trajectory_id, refs)
            statement = f'Buy {shown}: open it from the search results ("{product.action}").'
            add_candidate(candidates, ("product", asin), "requirement", statement).support(
                product.trajectory_id, [product.reference([asin])]
            )
            values = [step.command[1] for step in options]
            for step, value in zip(options, values):
                statement = f'On the product page, select the option "{value}" ("{step.action}").'
                add_candidate(candidates, ("option", value), "requirement", statement).support(
                    step.trajectory_id, [step.reference([value])]
                )
            after = ", after selecting " + ", ".join(f'"{v}"' for v in values) if values else ""
            statement = f'Click "buy now" only on the page of {asin.upper()}{after} ("{buy.action}").'
            refs = [product.reference([asin]), buy.reference([])]
            add_candidate(candidates, ("buy", asin, tuple(values)), "precondition", statement).support(buy.trajectory_id, refs)
            path_steps = [search, *pages, product, *options, buy]
            statement = "The click path that bought it: " + " -> ".join(f'"{s.action}"' for s in path_steps) + "."
            refs = [s.reference([asin, *values]) for s in path_steps]
            add_candidate(candidates, ("path", asin, tuple(values)), "ordering", statement).support(buy.trajectory_id, refs)
        if ("search",) in candidates:
            candidates[("search",)].statement = self._search_statement(list(queries.values()))
        return list(candidates.values())

    def anchors(self, action: str, task: str) -> list[str] | None:
        command = _webshop_command(action)
        if command is None:
            return None
        operation, argument = command
        return [argument] if operation == "click" and argument not in _WEBSHOP_BUTTONS else []

    def kind(self, action: str) -> str:
        command = _webshop_command(action)
        if command is None:
            return ""
        operation, argument = command
        return f"click[{argument}]" if operation == "click" and argument in _WEBSHOP_BUTTONS else operation

    @staticmethod
    def _purchase_path(steps: list[Step]) -> tuple[Step, list[Step], Step, list[Step], Step] | None:
        clicks = [s for s in steps if s.command[0] == "click"]
        buy = next((s for s in reversed(clicks) if s.command[1] == BUY_NOW), None)
        if buy is None:
            return None
        product = next(
            (
                s for s in reversed(clicks)
                if s.step < buy.step and s.command[1] not in _WEBSHOP_BUTTONS and _RESULTS_PAGE.search(s.pre)
            ),
            None,
        )
        if product is None:
            return None
        search = next((s for s in reversed(steps) if s.step < product.step and s.command[0] == "search"), None)
        if search is None:
            return None
        pages = [s for s in clicks if search.step < s.step < product.step and s.command[1] == NEXT_PAGE]
        # The values the page showed as chosen when it bought ("You have clicked V."): a later click in the same
        # option group replaced an earlier one. A page without those lines keeps every value clicked.
        chosen = [m.lower() for m in re.findall(r"You have clicked (.+?)\.(?: \[SEP\]|$)", buy.pre)]
        options: dict[str, Step] = {}
        for s in clicks:
            on_item_page = _segments(s.pre)[-1:] == ["Buy Now"]
            value = s.command[1]
            if product.step < s.step < buy.step and value not in _WEBSHOP_BUTTONS and on_item_page:
                if not chosen or value in chosen:
                    options.setdefault(value, s)
        return search, pages, product, list(options.values()), buy

    @staticmethod
    def _title(results_page: str, asin: str) -> str:
        """The title listed after the product id on the results page it was clicked from ("" if cut off)."""
        segments = _segments(results_page)
        for k, segment in enumerate(segments[:-1]):
            if segment.lower() == asin and ELLIPSIS not in segments[k + 1]:
                return segments[k + 1]
        return ""

    @staticmethod
    def _search_statement(queries: list[str]) -> str:
        words = [re.findall(r"[\w'-]+", _webshop_command(q)[1]) for q in queries]
        shared = [w for w in dict.fromkeys(words[0]) if all(w in other for other in words[1:])]
        if len(set(queries)) == 1:
            return f"Search with the instruction's words for the product, as the successful search did: \"{queries[0]}\"."
        listed = ", ".join(f'"{q}"' for q in dict.fromkeys(queries))
        common = f"; they share the words {', '.join(shared)}" if shared else ""
        return f"Search with the instruction's words for the product, as the successful searches did: {listed}{common}."



__all__ = ["WebShopRules"]
