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

Pages come from a server the adapter does not control, so it only follows ``http``/``https`` links and
redirects to the configured origin (scheme, host, port): a ``file:``, ``data:`` or ``ftp:`` link or another
host would otherwise put local files or forged pages into observations and logs. Such a link ends the episode
with a logged error. A page over ``MAX_PAGE_BYTES`` ends it too; an unknown charset is read as UTF-8 (as
browsers fall back), and parsing is linear in the page size, whatever the nesting.
"""

from __future__ import annotations

import html as html_lib
import http.client
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from .env import BUY_NOW, SEP, SiteError, WebShopEpisode

logger = logging.getLogger(__name__)

MAX_PAGE_BYTES = 5_000_000
_SKIPPED_TAGS = frozenset({"script", "style", "head", "title", "iframe", "template"})
_VOID_TAGS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


class _Page:
    """The visible texts and the clickables of one WebShop HTML page, fed by :func:`_parse`."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, bool]] = []  # (text, inside the instruction block)
        self.clickables: dict[str, tuple[str, str, str | None]] = {}  # name -> (method, url, option group)
        self.radios: dict[str, tuple[str, str, str | None]] = {}
        self.search_action: str | None = None
        self.reward_texts: list[str] = []
        self._stack: list[tuple[str, str]] = []  # (tag, role) of open non-void elements
        # Open-element counts per role and stack positions per tag, so that a hostile page nested thousands
        # deep costs O(1) per tag instead of a scan of the stack (the scan made parsing quadratic).
        self._open_roles: dict[str, int] = {}
        self._positions: dict[str, list[int]] = {}
        self._form: tuple[str, str] | None = None
        self._capture: list[str] | None = None
        self._capture_target: tuple[str, str, str | None] | None = None

    def _inside(self, role: str) -> bool:
        return self._open_roles.get(role, 0) > 0

    def _push(self, tag: str, role: str) -> None:
        self._positions.setdefault(tag, []).append(len(self._stack))
        self._open_roles[role] = self._open_roles.get(role, 0) + 1
        self._stack.append((tag, role))

    def _pop(self) -> str:
        tag, role = self._stack.pop()
        self._positions[tag].pop()
        self._open_roles[role] -= 1
        return role

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
        self._push(tag, role)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        # Close the innermost open element of this name, and everything opened inside it; WebShop's templates
        # have a few mismatched tags. Each element is popped once, so this is amortised O(1).
        positions = self._positions.get(tag)
        if not positions:
            return
        closed_roles = {self._pop() for _ in range(len(self._stack) - positions[-1])}
        if "clickable" in closed_roles and self._capture is not None:
            name = " ".join(" ".join(self._capture).split()).lower()
            if name and self._capture_target is not None:
                self.clickables.setdefault(name, self._capture_target)
            self._capture, self._capture_target = None, None

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if not text or self._inside("skip"):
            return
        if self._capture is not None:
            self._capture.append(text)
        if self._inside("reward"):
            self.reward_texts.append(text)
        self.texts.append((text, self._inside("instruction")))


# Where markup starts; any other "<" is text. Comments first, so "<!--" is not read as "<!".
_MARKUP = re.compile(r"<(?:!--|[!?]|/?[a-zA-Z])")
_TAG_NAME = re.compile(r"[a-zA-Z][^\s/>]*")
# Inside a tag, a quote opens a value only right after "=" (HTML's rule; "it's" in an unquoted value is text).
_TAG_STOP = re.compile(r"""=\s*(["'])|>""")
# Every alternative succeeds once started (an unclosed quote runs to the end of the tag), so no attribute
# costs a second scan.
_ATTRIBUTE = re.compile(r"""([^\s/>="']+)(?:\s*=\s*("[^"]*"?|'[^']*'?|[^\s>]*))?|\S""")
_RAW_TEXT_END = {name: re.compile(rf"</{name}", re.IGNORECASE) for name in ("script", "style")}


def _tag_end(text: str, start: int) -> int:
    """The index just past the ``>`` that closes the tag whose attributes start at ``start``; -1 at EOF."""
    position = start
    while (stop := _TAG_STOP.search(text, position)) is not None:
        if stop.group(1) is None:
            return stop.end()
        close = text.find(stop.group(1), stop.end())
        if close < 0:
            return -1
        position = close + 1
    return -1


def _attributes(body: str) -> list[tuple[str, str | None]]:
    attributes = []
    for match in _ATTRIBUTE.finditer(body):
        name, value = match.groups()
        if name is None:  # a stray "/", "=" or quote
            continue
        if value and value[0] in "\"'":
            value = value[1:-1] if len(value) > 1 and value[-1] == value[0] else value[1:]
        attributes.append((name.lower(), None if value is None else html_lib.unescape(value)))
    return attributes


def _parse(html: str) -> _Page:
    """Read a page in one pass, linear in its length whatever it holds.

    A small tokenizer instead of ``html.parser``: the standard library's parser rescans the rest of the
    page for every unfinished construct (``"</"``, ``"<a"``, ``"<!--x>"`` repeated), quadratic on a hostile
    page. As in HTML, an unclosed comment or tag runs to the end of the page; ``script``/``style`` hold raw
    text up to their end tag.
    """
    page, position, size = _Page(), 0, len(html)
    while position < size:
        markup = _MARKUP.search(html, position)
        start = markup.start() if markup else size
        if start > position:
            page.handle_data(html_lib.unescape(html[position:start]))
        if markup is None:
            break
        token = markup.group()
        if token == "<!--":
            end = html.find("-->", markup.end())
            position = size if end < 0 else end + 3
            continue
        if token in ("<!", "<?"):  # doctype, processing instruction, CDATA: not part of the page's text
            end = html.find(">", markup.end())
            position = size if end < 0 else end + 1
            continue
        name = _TAG_NAME.match(html, markup.end() - 1)
        end = _tag_end(html, name.end())
        if end < 0:
            break
        tag = name.group().lower()
        if token.startswith("</"):
            page.handle_endtag(tag)
            position = end
            continue
        page.handle_starttag(tag, _attributes(html[name.end() : end - 1]))
        position = end
        if tag in _RAW_TEXT_END:
            close = _RAW_TEXT_END[tag].search(html, end)
            position = size if close is None else close.start()
            page.handle_data(html[end:position])
    return page


def _decode(body: bytes, charset: str | None) -> str:
    """The page's text; a charset Python does not know, or one that is not a text encoding, reads as UTF-8."""
    try:
        return body.decode(charset or "utf-8", "replace")
    except (LookupError, UnicodeError):  # e.g. "x-bogus"; "base64" is known but not text; "idna" rejects "replace"
        return body.decode("utf-8", "replace")


def _origin(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an http(s) URL; None for any other scheme or an unparsable URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80)


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only through ``allow`` (which raises :class:`SiteError` for another origin)."""

    def __init__(self, allow: Callable[[str], str]) -> None:
        self._allow = allow

    def http_error_302(self, req, fp, code, msg, headers):  # noqa: ANN001, ANN201 - urllib's handler signature
        # Checked before urllib's own scheme filter, so a file: or data: redirect gets the same clear refusal.
        target = headers.get("location") or headers.get("uri")
        if target is not None:
            self._check(urllib.parse.urljoin(req.full_url, target.strip()), fp)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201
        return super().redirect_request(req, fp, code, msg, headers, self._check(newurl, fp))

    def _check(self, url: str, response: Any) -> str:
        try:
            return self._allow(url)
        except SiteError:
            response.close()
            raise


class WebShopServerEnv(WebShopEpisode):
    """One episode of goal ``goal_index`` on the WebShop site at ``url`` (e.g. ``http://127.0.0.1:3000``)."""

    def __init__(self, url: str, goal_index: int, max_turns: int = 15, timeout: float = 10.0,
                 instruction: str = "", task_type: str = "webshop", session_prefix: str = "taspo") -> None:
        super().__init__(instruction, task_type, max_turns)
        if not isinstance(url, str) or _origin(url) is None:
            raise ValueError(f"WebShop url must be an http:// or https:// URL with a host, got {url!r}")
        self.url = url.rstrip("/")
        self._origin = _origin(url)
        self._netloc = urllib.parse.urlsplit(url).netloc
        # Only http(s) handlers: urlopen's defaults would also open file:, data: and ftp: URLs.
        self._opener = urllib.request.OpenerDirector()
        for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), urllib.request.HTTPHandler(),
                        urllib.request.HTTPSHandler(), urllib.request.HTTPDefaultErrorHandler(),
                        _SameOriginRedirects(self._same_origin), urllib.request.HTTPErrorProcessor()):
            self._opener.add_handler(handler)
        self.goal_index = int(goal_index)
        self.timeout = timeout
        # The app picks goal N for any session id containing "fixed" whose last "_" part is N.
        self.session_id = f"{session_prefix}{uuid.uuid4().hex[:8]}_fixed_{self.goal_index}"
        self._current: _Page | None = None
        self._current_url = ""
        self._chosen: dict[str, str] = {}

    def _same_origin(self, url: str) -> str:
        """``url`` rebuilt on the configured host and port, or :class:`SiteError` when it leads elsewhere.

        The request goes to the configured netloc, not to the link's spelling of it, so no difference between
        this check's URL parser and urllib's can send it to another host.
        """
        if _origin(url) != self._origin:
            logger.warning("WebShop: refused %.200r (only %s is followed); the episode ends", url, self.url)
            raise SiteError(f"refused to open {url[:200]!r}: only http(s) pages of {self.url} are followed")
        parts = urllib.parse.urlsplit(url)
        return urllib.parse.urlunsplit((parts.scheme.lower(), self._netloc, parts.path, parts.query, ""))

    def _fetch(self, url: str, form: dict[str, str] | None = None) -> _Page:
        absolute = self._same_origin(urllib.parse.urljoin(self._current_url or self.url + "/", url.strip()))
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(absolute, data=data, method="POST" if data is not None else "GET")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body = response.read(MAX_PAGE_BYTES + 1)
                html = _decode(body, response.headers.get_content_charset())
                final_url = response.geturl()
        except urllib.error.HTTPError as error:
            raise SiteError(f"the server answered HTTP {error.code} for {absolute}") from error
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise SiteError(f"could not reach the WebShop server at {self.url} ({error})") from error
        if len(body) > MAX_PAGE_BYTES:  # a truncated page would silently lose its tail (its buttons, its score)
            raise SiteError(f"the page at {absolute} is larger than {MAX_PAGE_BYTES} bytes")
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

