"""Adapter to a running WebShop site (princeton-nlp/WebShop's Flask app, ``web_agent_site/app.py``).

The app serves one HTML page per state and keeps no per-session state beyond the goal, so the adapter works
like a minimal browser: it reads a page's clickables the way WebShop's text environment does (elements with the
``btn`` class, ``product-link`` anchors, radio inputs' values; all lowercased) and follows them:

- ``search[q]`` posts ``search_query=q`` to the search form (the app redirects to
  ``/search_results/<session>/<keywords>/1``);
- a button posts to its form's ``action`` (next/previous page, back to search, the item's sub-pages, and
  ``Buy Now`` -> ``/done/<session>/<asin>/<options>``);
- a product id follows its ``href`` (``/item_page/<session>/<asin>/<keywords>/<page>/{}``);
- an option value follows its ``data-url`` (the same item page with that option set; the app's page script
  does this in a browser).

The session id ends in ``fixed_<goal_index>``, which makes the app serve that goal. The score is read from the
done page's ``#reward`` element. Only the standard library is used; every request has a timeout, and any
network or parsing failure ends the episode with an error observation instead of raising.
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from html.parser import HTMLParser

from .env import BUY_NOW, SEP, SiteError, WebShopEpisode

MAX_PAGE_BYTES = 5_000_000
_SKIPPED_TAGS = frozenset({"script", "style", "head", "title", "iframe", "template"})
_VOID_TAGS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


class _Page(HTMLParser):
    """The visible texts and the clickables of one WebShop HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[tuple[str, bool]] = []  # (text, inside the instruction block)
        self.clickables: dict[str, tuple[str, str, str | None]] = {}  # name -> (method, url, option group)
        self.radios: dict[str, tuple[str, str, str | None]] = {}
        self.search_action: str | None = None
        self.reward_texts: list[str] = []
        self._stack: list[tuple[str, str]] = []  # (tag, role) of open non-void elements
        self._form: tuple[str, str] | None = None
        self._capture: list[str] | None = None
        self._capture_target: tuple[str, str, str | None] | None = None

    def _inside(self, role: str) -> bool:
        return any(r == role for _, r in self._stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        classes = attributes.get("class", "").split()
        if tag == "form":
            self._form = (attributes.get("method", "get").lower(), attributes.get("action", ""))
        if tag == "input":
            if attributes.get("id") == "search_input" or attributes.get("name") == "search_query":
                self.search_action = self._form[1] if self._form else ""
            if attributes.get("type", "").lower() == "radio" and attributes.get("value"):
                url = attributes.get("data-url", "")
                self.radios.setdefault(attributes["value"], ("get", url, attributes.get("name")))
        if tag in _VOID_TAGS:
            return
        role = ""
        style = attributes.get("style", "").replace(" ", "").lower()
        if tag in _SKIPPED_TAGS or "hidden" in attributes or "display:none" in style:
            role = "skip"
        elif attributes.get("id") == "instruction-text":
            role = "instruction"
        elif attributes.get("id") == "reward":
            role = "reward"
        elif tag == "button" and "btn" in classes and self._form is not None:
            role = "clickable"
            self._capture_target = (self._form[0], self._form[1], None)
        elif tag == "a" and "product-link" in classes:
            role = "clickable"
            self._capture_target = ("get", attributes.get("href", ""), None)
        if role == "clickable":
            self._capture = []
        self._stack.append((tag, role))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        # Close the innermost open element of this name; WebShop's templates have a few mismatched tags.
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                closed = self._stack[i:]
                del self._stack[i:]
                if any(role == "clickable" for _, role in closed) and self._capture is not None:
                    name = " ".join(" ".join(self._capture).split()).lower()
                    if name and self._capture_target is not None:
                        self.clickables.setdefault(name, self._capture_target)
                    self._capture, self._capture_target = None, None
                return

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if not text or self._inside("skip"):
            return
        if self._capture is not None:
            self._capture.append(text)
        if self._inside("reward"):
            self.reward_texts.append(text)
        self.texts.append((text, self._inside("instruction")))


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    page.close()
    return page


class WebShopServerEnv(WebShopEpisode):
    """One episode of goal ``goal_index`` on the WebShop site at ``url`` (e.g. ``http://127.0.0.1:3000``)."""

    def __init__(self, url: str, goal_index: int, max_turns: int = 15, timeout: float = 10.0,
                 instruction: str = "", task_type: str = "webshop", session_prefix: str = "taspo") -> None:
        super().__init__(instruction, task_type, max_turns)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"WebShop url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.goal_index = int(goal_index)
        self.timeout = timeout
        # The app picks goal N for any session id containing "fixed" whose last "_" part is N.
        self.session_id = f"{session_prefix}{uuid.uuid4().hex[:8]}_fixed_{self.goal_index}"
        self._current: _Page | None = None
        self._current_url = ""
        self._chosen: dict[str, str] = {}

    def _fetch(self, url: str, form: dict[str, str] | None = None) -> _Page:
        absolute = urllib.parse.urljoin(self._current_url or self.url + "/", url)
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(absolute, data=data, method="POST" if data is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                charset = response.headers.get_content_charset() or "utf-8"
                html = response.read(MAX_PAGE_BYTES).decode(charset, "replace")
                final_url = response.geturl()
        except urllib.error.HTTPError as error:
            raise SiteError(f"the server answered HTTP {error.code} for {absolute}") from error
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise SiteError(f"could not reach the WebShop server at {self.url} ({error})") from error
        self._current_url = final_url
        return _parse(html)

    def _open(self) -> None:
        self._current, self._current_url, self._chosen = None, "", {}
        self._current = self._fetch(f"{self.url}/{self.session_id}")
        if not self._instruction:
            self._instruction = instruction_from_page(self._current)

    def _page_or_fail(self) -> _Page:
        if self._current is None:
            raise SiteError("no page loaded")
        return self._current

    def _has_search_bar(self) -> bool:
        return self._current is not None and self._current.search_action is not None

    def _clickables(self) -> list[str]:
        if self._current is None:
            return []
        names = [n for n in self._current.clickables if n != "search"]  # WebShop refuses click[search]
        return names + [v for v in self._current.radios if v not in self._current.clickables]

    def _search(self, query: str) -> None:
        page = self._page_or_fail()
        self._chosen = {}
        self._current = self._fetch(page.search_action or f"{self.url}/{self.session_id}", {"search_query": query})

    def _click(self, target: str) -> float | None:
        page = self._page_or_fail()
        method, url, group = page.clickables.get(target) or page.radios[target]
        if group is not None:
            self._chosen[group] = target
        elif target == "back to search" or (method == "get" and "/item_page/" in url):  # a product link
            self._chosen = {}
        self._current = self._fetch(url, {} if method == "post" else None)
        if target == BUY_NOW:
            return score_from_page(self._current)
        return None

    def _page(self) -> str:
        page = self._page_or_fail()
        with_instruction = page.search_action is not None
        texts = [text for text, in_instruction in page.texts if with_instruction or not in_instruction]
        if page.radios:
            texts = [f"You have clicked {value}." for value in self._chosen.values()] + texts
        return SEP.join(texts)


def instruction_from_page(page: _Page) -> str:
    """The goal sentence from a page's instruction block ("Instruction: ..."), or ""."""
    parts = [text for text, in_instruction in page.texts if in_instruction]
    joined = " ".join(parts)
    joined = joined.split("Current Query:")[0]
    return joined.replace("Instruction:", "", 1).strip()


def score_from_page(page: _Page) -> float:
    """The purchase score printed in the done page's ``#reward`` element."""
    numbers = [float(n) for text in page.reward_texts for n in _NUMBER.findall(text)]
    # The element reads "Your score (min 0.0, max 1.0) <score>": the score is the last number.
    if not numbers:
        raise SiteError("the done page shows no score")
    return min(max(numbers[-1], 0.0), 1.0)


def fetch_instruction(url: str, goal_index: int, timeout: float = 10.0) -> str:
    """Goal ``goal_index``'s instruction as the server shows it (raises ``ConnectionError`` when unreachable)."""
    env = WebShopServerEnv(url, goal_index, timeout=timeout)
    observation = env.reset()
    if env.error is not None:
        raise ConnectionError(f"WebShop server at {url}: {env.error}")
    if not env.task:
        raise ConnectionError(
            f"WebShop server at {url} showed no instruction for goal {goal_index}: {observation[:200]}"
        )
    return env.task

