"""Analyzer backends for the A.2 protocol: one small interface, three implementations.

An analyzer turns chat messages into raw text (``complete``); the protocol module parses and validates that
text, so every backend goes through the same checks. ``workers`` says how many requests the builder may run
at once. Failures raise :class:`AnalyzerError`; the builder turns them into empty PI, never a crash.

- :class:`OpenAICompatibleAnalyzer`: the paper's setting (Table C.3: DeepSeek, temperature 0, 4,096 output
  tokens, 4 workers) against any OpenAI-compatible server (DeepSeek, vLLM, ``transformers serve``), with a
  disk cache so reruns and resumed runs see the same answers.
- :class:`TransformersAnalyzer`: a local causal LM, greedy decoding.
- :class:`RuleBasedAnalyzer`: the embedded default, deterministic and model-free, for ALFWorld, WebShop and
  Search-QA.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..cache_manifest import text_sha256
from ..envs.search.env import parse_search_action
from ..envs.search.scoring import normalize_answer
from ..envs.webshop.env import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, SUB_PAGES
from ..envs.webshop.env import parse_action as parse_webshop_action
from .protocol import ELLIPSIS, MAX_STATEMENT_CHARS

logger = logging.getLogger(__name__)

Messages = list[dict[str, str]]

REASONING_MODES = ("off", "on", "server_default")
"""The analyzer's reasoning ("thinking") setting: the paper runs its analyzer with reasoning off (Table C.3)."""
REASONING_PARAMS = ("thinking", "chat_template_kwargs")
"""How a server takes that setting: DeepSeek's ``thinking`` object, or the ``enable_thinking`` chat-template switch
that vLLM, SGLang and ``transformers serve`` pass to Qwen3-style templates."""


class AnalyzerError(RuntimeError):
    """An analyzer could not produce an answer (connection, timeout, HTTP error, empty reply, model failure)."""


@runtime_checkable
class Analyzer(Protocol):
    """Chat messages in, raw text out; ``workers`` = how many ``complete`` calls may run concurrently."""

    workers: int

    def complete(self, messages: Messages) -> str: ...


# ----------------------------------------------------------------------------------------------- OpenAI-compatible


def reasoning_request_fields(mode: str = "off", param: str = "thinking") -> dict[str, Any]:
    """The request-body fields that set an OpenAI-compatible server's reasoning ``mode`` through ``param``.

    ``off`` / ``on`` with ``thinking``: ``{"thinking": {"type": "disabled" / "enabled"}}`` (DeepSeek's switch);
    with ``chat_template_kwargs``: ``{"chat_template_kwargs": {"enable_thinking": false / true}}``.
    ``server_default`` sends nothing, for servers that refuse unknown fields (the OpenAI API does).
    """
    if mode not in REASONING_MODES:
        raise ValueError(f"analyzer reasoning must be one of {REASONING_MODES}, got {mode!r}")
    if param not in REASONING_PARAMS:
        raise ValueError(f"analyzer reasoning parameter must be one of {REASONING_PARAMS}, got {param!r}")
    if mode == "server_default":
        return {}
    if param == "thinking":
        return {"thinking": {"type": "enabled" if mode == "on" else "disabled"}}
    return {"chat_template_kwargs": {"enable_thinking": mode == "on"}}


class OpenAICompatibleAnalyzer:
    """An OpenAI-compatible chat-completions endpoint, through the official ``openai`` client.

    ``api_key`` is sent as is (None: no key, for local servers). ``timeout`` (seconds) and ``max_retries`` go
    to the client, which retries timeouts, connection errors, 429s and 5xx with backoff. ``extra_body`` holds
    fields added to every request body beyond the OpenAI schema, such as the reasoning switch of
    ``reasoning_request_fields``. With ``cache_dir`` every answer is stored under a hash of the request (model,
    messages, temperature, max_tokens, extra fields), and a repeated request is answered from disk without
    contacting the server. ``requests`` / ``cache_hits`` / ``failures`` count calls (thread-safe).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 4096,
        timeout: float = 60,
        max_retries: int = 2,
        workers: int = 4,
        cache_dir: str | os.PathLike[str] | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        try:
            from openai import OpenAI
        except ImportError:
            raise ImportError(
                "The openai analyzer needs the openai package: pip install 'taspo-trl[openai]'. "
                "Or use analyzer: rule (offline, no package needed)."
            ) from None

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self.workers = workers
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # Exactly the key given, never another variable's: that key would go to whatever base_url says.
        # Local servers (vLLM, transformers serve) accept any key, but the client insists on one.
        key = api_key or "EMPTY"
        self._client = OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries)
        self._lock = threading.Lock()
        self.requests = 0
        self.cache_hits = 0
        self.failures = 0
        self._reasked: set[str] = set()  # keys whose empty cached answer this run already asked again

    def request_key(self, messages: Messages) -> str:
        """The cache key of a request: SHA-256 of its model, messages and sampling parameters."""
        request = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.extra_body:  # absent when empty, so caches written without extra fields stay valid
            request["extra_body"] = self.extra_body
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def complete(self, messages: Messages) -> str:
        """The assistant text for ``messages``, from the cache when present. Raises :class:`AnalyzerError`."""
        key = self.request_key(messages)
        cached = self._read_cache(key)
        if cached is not None:
            self._bump("cache_hits")
            return cached
        self._bump("requests")
        text = self._request(messages)
        self._write_cache(key, text)
        return text

    def _request(self, messages: Messages) -> str:
        from openai import OpenAIError

        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                extra_body=self.extra_body or None,
            )
            text = response.choices[0].message.content if response.choices else None
        except OpenAIError as error:
            self._bump("failures")
            raise AnalyzerError(
                f"analyzer request to {self._client.base_url} failed: {type(error).__name__}: {error}"
            ) from error
        if not text:
            self._bump("failures")
            raise AnalyzerError(f"analyzer at {self._client.base_url} returned an empty answer")
        return text

    def _bump(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def _cache_path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / key[:2] / f"{key}.json"

    def _read_cache(self, key: str) -> str | None:
        """The cached answer, or None to ask the server (and overwrite the entry).

        A damaged entry or one whose ``"text"`` is not a string is a miss. An empty answer (never written by
        this class, but left by older versions or other tools) is asked again once per run; if that fails
        too, later calls in the run raise :class:`AnalyzerError` instead of asking yet again.
        """
        path = self._cache_path(key)
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        text = entry.get("text") if isinstance(entry, dict) else None
        if not isinstance(text, str):
            return None
        if "sha256" in entry and entry["sha256"] != text_sha256(text):  # entries written before digests have none
            logger.warning("the cached analyzer answer %s does not match its SHA-256 (changed or damaged); asking again", path)
            return None
        if text:
            return text
        with self._lock:
            if key not in self._reasked:
                self._reasked.add(key)
                return None
        self._bump("failures")
        raise AnalyzerError(f"the cached analyzer answer {path} is empty, and asking again in this run failed")

    def _write_cache(self, key: str, text: str) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader or a killed run never sees half an entry.
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump({"model": self.model, "text": text, "sha256": text_sha256(text)}, handle, ensure_ascii=False)
        os.replace(handle.name, path)


# ----------------------------------------------------------------------------------------------- local transformers


class TransformersAnalyzer:
    """A local causal LM with a chat template, decoding greedily (the paper's analyzer runs at temperature 0).

    ``model_or_path`` is a loaded model (then pass ``tokenizer``) or a path / hub id / ``"embedded"``.
    ``reasoning`` (``off``, ``on`` or ``server_default``) reaches the chat template as ``enable_thinking``, the
    switch of Qwen3-style templates; templates without it ignore it, and ``server_default`` leaves it unset.
    Generation is serialised: one model instance serves one request at a time.
    """

    workers = 1

    def __init__(
        self, model_or_path: Any, tokenizer: Any = None, max_new_tokens: int = 4096, reasoning: str = "off"
    ) -> None:
        if reasoning not in REASONING_MODES:
            raise ValueError(f"analyzer reasoning must be one of {REASONING_MODES}, got {reasoning!r}")
        if isinstance(model_or_path, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from ..models import resolve_model_path

            path = resolve_model_path(str(model_or_path))
            model_or_path = AutoModelForCausalLM.from_pretrained(path)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        if tokenizer is None:
            raise ValueError("TransformersAnalyzer needs the tokenizer when given a loaded model.")
        self.model = model_or_path.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.template_kwargs = {} if reasoning == "server_default" else {"enable_thinking": reasoning == "on"}
        self._lock = threading.Lock()

    def prompt_inputs(self, messages: Messages) -> Any:
        """The chat-templated ``messages`` as model inputs (``input_ids``, ``attention_mask``) on the model's device."""
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True, **self.template_kwargs
        ).to(self.model.device)

    def complete(self, messages: Messages) -> str:
        """Greedy continuation of the chat-templated ``messages``. Raises :class:`AnalyzerError`."""
        import torch

        try:
            inputs = self.prompt_inputs(messages)
            prompt_len = inputs["input_ids"].shape[1]
            room = self._max_positions() - prompt_len
            if room <= 0:
                raise AnalyzerError(f"analyzer prompt of {prompt_len} tokens exceeds the model's context")
            pad = (
                self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            )
            with self._lock, torch.no_grad():
                output = self.model.generate(
                    **inputs, do_sample=False, max_new_tokens=min(self.max_new_tokens, room), pad_token_id=pad
                )
        except AnalyzerError:
            raise
        except Exception as error:  # any model/tokenizer failure is one failed request, not a crashed run
            raise AnalyzerError(f"local analyzer generation failed: {type(error).__name__}: {error}") from error
        return self.tokenizer.decode(output[0, prompt_len:], skip_special_tokens=True)

    def _max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", None) or 1 << 30)


# ----------------------------------------------------------------------------------------------- rule-based
#
# One deterministic rule set per environment family, chosen from the syntax of the actions it reads: ALFWorld
# commands ("take apple 1 from countertop 1"), WebShop's "search[...]" / "click[...]", Search-QA's canonical
# "<search>...</search>" / "<answer>...</answer>" blocks. Each turns verified successes into candidate items
# (extraction) and names what an item's source actions refer to, which the target's records must show before
# the item applies to it (alignment).

_QUOTE_CHARS = 160


def _mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text.lower()) is not None


# Where quotable pieces end: sentence ends, WebShop's " [SEP] " between page texts, and Search-QA's
# "<information>" wrapper and "Doc 2(Title: T)" headers (a quote then holds what a document says, not its header).
_PIECE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*\[SEP\]\s*|\s*</?information>\s*|\s*Doc \d+\(Title: [^)]*\)\s*")


def _sentences(field: str) -> list[str]:
    """Quotable pieces of a compacted field (sentences, page texts) that never straddle an elision gap."""
    pieces = []
    for segment in field.split(ELLIPSIS):
        pieces += [s.strip() for s in _PIECE_BREAK.split(segment) if s.strip()]
    return pieces


def _naming_quote(field: str, names: Iterable[str]) -> str:
    """The first piece of ``field`` naming one of ``names`` (in the order of ``names``), or ""."""
    sentences = _sentences(field)
    for name in names:
        for sentence in sentences:
            if _mentions(sentence, name):
                return sentence[:_QUOTE_CHARS].strip()
    return ""


def _quote(field: str, names: Iterable[str]) -> str:
    """A short verbatim quote of ``field``: the first piece naming one of ``names``, else its first piece."""
    sentences = _sentences(field)
    return _naming_quote(field, names) or (sentences[0][:_QUOTE_CHARS].strip() if sentences else "")


@dataclass
class _Step:
    """One effective step of a verified success; ``command`` is its action as its rule set parsed it."""

    trajectory_id: int
    step: int
    action: str
    command: Any
    pre: str
    post: str

    def reference(self, names: Iterable[str]) -> dict[str, Any]:
        """A citation of this step: the action, and the observation after it (or, when only the one before
        names the step's things, that one; a product id shows on the results page, not on the product's page)."""
        names = list(names)
        post = _naming_quote(self.post, names)
        pre = "" if post else _naming_quote(self.pre, names)
        if not (post or pre):
            post = _quote(self.post, names)
            pre = "" if post else _quote(self.pre, names)
        quote = {"post_observation_quote": post} if post else {"pre_observation_quote": pre}
        return {"trajectory_id": self.trajectory_id, "step": self.step, "action_quote": self.action, **quote}


def _effective_steps(success: dict[str, Any], parse: Callable[[str], Any], failed: str) -> list[_Step]:
    """The steps of ``success`` whose action ``parse`` understands and whose answer does not start ``failed``."""
    steps = []
    for raw in success["steps"]:
        command = parse(raw["action"])
        if command is not None and not raw["post_observation"].lower().startswith(failed):
            steps.append(
                _Step(success["trajectory_id"], raw["step"], raw["action"], command, raw["pre_observation"],
                      raw["post_observation"])
            )
    return steps


class _Candidate:
    """An item under construction: its statement, first-seen rank, and one reference set per supporting success."""

    def __init__(self, kind: str, statement: str, rank: int) -> None:
        self.kind, self.statement, self.rank = kind, statement, rank
        self.refs: dict[int, list[dict[str, Any]]] = {}

    def support(self, trajectory_id: int, refs: list[dict[str, Any]]) -> None:
        self.refs.setdefault(trajectory_id, refs)  # the first occurrence in each success is its evidence

    def as_item(self, item_id: str) -> dict[str, Any]:
        evidence = [ref for tid in sorted(self.refs) for ref in self.refs[tid]]
        return {
            "id": item_id,
            "kind": self.kind,
            "statement": self.statement[:MAX_STATEMENT_CHARS],
            "evidence": evidence,
        }


_Candidates = dict[tuple, _Candidate]


def _add(candidates: _Candidates, key: tuple, kind: str, statement: str) -> _Candidate:
    return candidates.setdefault(key, _Candidate(kind, statement, len(candidates)))


class _Rules(Protocol):
    """One environment family's rules: ``extract`` returns the candidates of an extraction payload's successes,
    ``anchors`` the things an action refers to (None when the action is not one of this family's), ``kind`` the
    sort of action it is (a target's action of the same kind is quoted when an item names nothing)."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[_Candidate]: ...

    def anchors(self, action: str, task: str) -> list[str] | None: ...

    def kind(self, action: str) -> str: ...


# ---- ALFWorld

_KEY_VERBS = ("take", "put", "heat", "cool", "clean", "slice", "use")
_COMMAND_FORMS = (
    ("goto", re.compile(r"go to (?P<rec>.+)")),
    ("take", re.compile(r"take (?P<obj>.+?) from (?P<rec>.+)")),
    ("put", re.compile(r"(?:move|put) (?P<obj>.+?) (?:to|in/on|into|onto|in|on) (?P<rec>.+)")),
    ("open", re.compile(r"open (?P<rec>.+)")),
    ("close", re.compile(r"close (?P<rec>.+)")),
    ("heat", re.compile(r"heat (?P<obj>.+?) with (?P<rec>.+)")),
    ("cool", re.compile(r"cool (?P<obj>.+?) with (?P<rec>.+)")),
    ("clean", re.compile(r"clean (?P<obj>.+?) with (?P<rec>.+)")),
    ("slice", re.compile(r"slice (?P<obj>.+?) with (?P<rec>.+)")),
    ("use", re.compile(r"use (?P<obj>.+)")),
    ("examine", re.compile(r"examine (?P<obj>.+)")),
)
_FAILED = "nothing happens"


@dataclass(frozen=True)
class Command:
    """An ALFWorld command split into verb, object and receptacle (instance names such as "apple 1")."""

    verb: str
    obj: str
    rec: str

    @property
    def entities(self) -> tuple[str, ...]:
        return tuple(name for name in (self.obj, self.rec) if name)


def parse_command(action: str) -> Command | None:
    """Parse an ALFWorld command ("take apple 1 from countertop 1", "move apple 1 to fridge 1", ...)."""
    text = " ".join(action.lower().split())
    for verb, form in _COMMAND_FORMS:
        match = form.fullmatch(text)
        if match:
            groups = match.groupdict()
            return Command(verb, groups.get("obj") or "", groups.get("rec") or "")
    return None


def entity_type(name: str) -> str:
    """The type of an instance name ("apple 1" -> "apple"), so items group the same kind of step across runs."""
    return re.sub(r"\s+\d+$", "", name)


def _phrase(command: Command) -> str:
    obj, rec = entity_type(command.obj), entity_type(command.rec)
    return {
        "take": f"take the {obj} from the {rec}",
        "put": f"put the {obj} in/on the {rec}",
        "use": f"use the {obj}",
    }.get(command.verb, f"{command.verb} the {obj} with the {rec}")


class _ALFWorldRules:
    """From the successes' effective actions (not answered "Nothing happens.") on things the task names ("key
    actions": take / move / heat / cool / clean / slice / use):
      (a) requirements: each key action the successes performed;
      (b) preconditions: the "go to R" and "open R" that preceded a key action on receptacle R;
      (c) ordering: consecutive key actions, in the order the successes did them (pairs some success
          reversed are dropped).
    An item's anchors are the objects and receptacles its source actions name."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[_Candidate]:
        candidates: _Candidates = {}
        reversed_pairs: set[tuple] = set()
        for success in successes:
            steps = _effective_steps(success, parse_command, _FAILED)
            keys = [s for s in steps if s.command.verb in _KEY_VERBS and self._on_task(s.command, task)]
            for step in keys:
                self._requirement(candidates, step)
                self._preconditions(candidates, step, steps)
            self._orderings(candidates, reversed_pairs, keys)
        return [c for key, c in candidates.items() if key not in reversed_pairs]

    def anchors(self, action: str, task: str) -> list[str] | None:
        command = parse_command(action)
        return None if command is None else list(command.entities)

    def kind(self, action: str) -> str:
        command = parse_command(action)
        return command.verb if command else ""

    @staticmethod
    def _on_task(command: Command, task: str) -> bool:
        return any(_mentions(task, entity_type(name)) for name in command.entities)

    @staticmethod
    def _requirement(candidates: _Candidates, step: _Step) -> None:
        c = step.command
        statement = f'Required: {_phrase(c)} ("{step.action}").'
        key = ("requirement", c.verb, entity_type(c.obj), entity_type(c.rec))
        _add(candidates, key, "requirement", statement).support(step.trajectory_id, [step.reference(c.entities)])

    @staticmethod
    def _preconditions(candidates: _Candidates, step: _Step, steps: list[_Step]) -> None:
        """The latest "go to R" (and "open R" after it) before a key action on receptacle R."""
        c = step.command
        target = c.rec
        if c.verb in ("use", "slice") or not target:  # these act on a held tool or device, not at a receptacle
            return
        earlier = [s for s in steps if s.step < step.step]
        goto = next((s for s in reversed(earlier) if s.command.verb == "goto" and s.command.rec == target), None)
        after_goto = [s for s in earlier if goto is None or s.step > goto.step]
        opened = next((s for s in reversed(after_goto) if s.command.verb == "open" and s.command.rec == target), None)
        for before, verb in ((goto, "Go to"), (opened, "Open")):
            if before is None:
                continue
            statement = f'{verb} the {entity_type(target)} before you {_phrase(c)} ("{before.action}").'
            key = ("precondition", before.command.verb, entity_type(target), c.verb, entity_type(c.obj))
            refs = [before.reference([target, c.obj]), step.reference(c.entities)]
            _add(candidates, key, "precondition", statement).support(step.trajectory_id, refs)

    @staticmethod
    def _orderings(candidates: _Candidates, reversed_pairs: set[tuple], keys: list[_Step]) -> None:
        firsts: dict[tuple, _Step] = {}
        for step in keys:
            firsts.setdefault((step.command.verb, entity_type(step.command.obj), entity_type(step.command.rec)), step)
        ordered = list(firsts.items())
        for (sig_a, a), (sig_b, b) in pairwise(ordered):
            reversed_pairs.add(("ordering", sig_b, sig_a))
            statement = (
                f'{_phrase(a.command).capitalize()} before you {_phrase(b.command)} ("{a.action}", then "{b.action}").'
            )
            refs = [a.reference(a.command.entities), b.reference(b.command.entities)]
            _add(candidates, ("ordering", sig_a, sig_b), "ordering", statement).support(a.trajectory_id, refs)


# ---- WebShop

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


class _WebShopRules:
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

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[_Candidate]:
        candidates: _Candidates = {}
        queries: dict[int, str] = {}
        for success in successes:
            path = self._purchase_path(_effective_steps(success, _webshop_command, _WEBSHOP_INVALID))
            if path is None:
                continue
            search, pages, product, options, buy = path
            asin = product.command[1]
            title = self._title(product.pre, asin)
            shown = f"{asin.upper()}{f' ({title})' if title else ''}"
            queries[search.trajectory_id] = search.action
            _add(candidates, ("search",), "requirement", "").support(search.trajectory_id, [search.reference([asin])])
            if pages:
                statement = (
                    f'{asin.upper()} is not on the first results page: click "next >" until it shows up '
                    f'("{pages[-1].action}").'
                )
                refs = [pages[-1].reference([asin]), product.reference([asin])]
                _add(candidates, ("next_page", asin), "precondition", statement).support(product.trajectory_id, refs)
            statement = f'Buy {shown}: open it from the search results ("{product.action}").'
            _add(candidates, ("product", asin), "requirement", statement).support(
                product.trajectory_id, [product.reference([asin])]
            )
            values = [step.command[1] for step in options]
            for step, value in zip(options, values):
                statement = f'On the product page, select the option "{value}" ("{step.action}").'
                _add(candidates, ("option", value), "requirement", statement).support(
                    step.trajectory_id, [step.reference([value])]
                )
            after = ", after selecting " + ", ".join(f'"{v}"' for v in values) if values else ""
            statement = f'Click "buy now" only on the page of {asin.upper()}{after} ("{buy.action}").'
            refs = [product.reference([asin]), buy.reference([])]
            _add(candidates, ("buy", asin, tuple(values)), "precondition", statement).support(buy.trajectory_id, refs)
            path_steps = [search, *pages, product, *options, buy]
            statement = "The click path that bought it: " + " -> ".join(f'"{s.action}"' for s in path_steps) + "."
            refs = [s.reference([asin, *values]) for s in path_steps]
            _add(candidates, ("path", asin, tuple(values)), "ordering", statement).support(buy.trajectory_id, refs)
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
    def _purchase_path(steps: list[_Step]) -> tuple[_Step, list[_Step], _Step, list[_Step], _Step] | None:
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
        options: dict[str, _Step] = {}
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


# ---- Search-QA

_SEARCH_QA_INVALID = "invalid action"
_DOC_TITLE = re.compile(r"Doc \d+\(Title: (.*?)\)")


def _search_qa_command(action: str) -> tuple[str, str] | None:
    """("search", query) or ("answer", text) from a canonical block; None for anything else."""
    kind, content = parse_search_action(action)
    return (kind, content) if kind in ("search", "answer") and content else None


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _holds(text: str, answer: str) -> bool:
    """Whether ``text`` contains ``answer`` as whole words, both SQuAD-normalised as the reward compares them."""
    needle = normalize_answer(answer)
    return bool(needle) and f" {needle} " in f" {normalize_answer(text)} "


class _SearchQARules:
    """From each success's answer and the searches that led to it:
      requirements: the search whose results hold the answer (the first one that retrieved it) and, going back,
          each earlier search whose results named the words a later query added to the question (the hops of a
          multi-hop question); what was learned: the retrieved document's sentence that states the answer,
          and the answer itself;
      ordering: consecutive hops.
    Every sibling faces the same question over the same corpus with an open action space, so nothing needs
    anchoring in its records: each item applies, quoting the target's own search or answer."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[_Candidate]:
        candidates: _Candidates = {}
        question = _words(task)
        for success in successes:
            steps = _effective_steps(success, _search_qa_command, _SEARCH_QA_INVALID)
            answer = next((s for s in reversed(steps) if s.command[0] == "answer"), None)
            if answer is None:
                continue
            text = answer.command[1]
            searches = [s for s in steps if s.command[0] == "search" and s.step < answer.step]
            found = next((s for s in searches if _holds(s.post, text)), None)
            chain = self._hops(found, searches, question) if found else []
            for k, step in enumerate(chain):
                query = step.command[1]
                if step is found:
                    statement = f'Search for "{query}": its results hold the answer ("{step.action}").'
                    names = [text.lower()]
                else:
                    following = chain[k + 1].command[1]
                    statement = (
                        f'Search for "{query}" first: its results lead to the next search, "{following}" '
                        f'("{step.action}").'
                    )
                    names = sorted(_words(following) - question)
                key = ("search", tuple(sorted(_words(query))))
                _add(candidates, key, "requirement", statement).support(step.trajectory_id, [step.reference(names)])
            for a, b in pairwise(chain):
                qa, qb = a.command[1], b.command[1]
                statement = f'Search for "{qa}" before you search for "{qb}" ("{a.action}", then "{b.action}").'
                key = ("ordering", tuple(sorted(_words(qa))), tuple(sorted(_words(qb))))
                refs = [a.reference([]), b.reference([])]
                _add(candidates, key, "ordering", statement).support(a.trajectory_id, refs)
            statement, refs = f'Answer "{text}" ("{answer.action}").', [answer.reference([])]
            if found is not None:
                sentence = next((s for s in _sentences(found.post) if _holds(s, text)), "")[:_QUOTE_CHARS].strip()
                titles = _DOC_TITLE.findall(found.post[: found.post.find(sentence)]) if sentence else []
                source = f'"{titles[-1]}"' if titles else "a document"
                statement = (
                    f'The search "{found.command[1]}" retrieved {source}, which says: "{sentence}" So the answer is '
                    f'"{text}" ("{answer.action}").'
                )
                refs = [found.reference([text.lower()]), *refs]
            key = ("answer", normalize_answer(text))
            _add(candidates, key, "requirement", statement).support(answer.trajectory_id, refs)
        return list(candidates.values())

    def anchors(self, action: str, task: str) -> list[str] | None:
        return None if _search_qa_command(action) is None else []

    def kind(self, action: str) -> str:
        command = _search_qa_command(action)
        return command[0] if command else ""

    @staticmethod
    def _hops(found: _Step, searches: list[_Step], question: set[str]) -> list[_Step]:
        """``found`` and, going back, the latest earlier search whose results name every word the next query
        adds to the question."""
        chain = [found]
        while True:
            added = _words(chain[0].command[1]) - question
            earlier = [s for s in searches if s.step < chain[0].step and added and added <= _words(s.post)]
            if not earlier:
                return chain
            chain.insert(0, earlier[-1])


_ALFWORLD, _WEBSHOP, _SEARCH_QA = _ALFWorldRules(), _WebShopRules(), _SearchQARules()
RULE_SETS: dict[str, _Rules] = {"alfworld": _ALFWORLD, "webshop": _WEBSHOP, "search": _SEARCH_QA}
"""The rule-based analyzer's rule sets, by the name of the built-in environment whose actions they read."""


def unknown_rule_set(environment: str | None) -> str:
    """Why the rule-based analyzer cannot serve ``environment`` (None: an environment given as a factory), and
    the fix."""
    which = f"environment {environment!r}" if environment else "an environment passed as a factory"
    return (
        f"the rule-based analyzer (analyzer='rule') has rules for {', '.join(map(repr, RULE_SETS))} only, not for "
        f"{which}: set analyzer='openai' (any OpenAI-compatible server) or analyzer='transformers' (a local model), "
        "or analyzer_rules to one of those names if your environment uses its actions."
    )


def _rules_for(actions: Iterable[str]) -> _Rules:
    """The rule set whose action syntax the actions use (Search-QA blocks, WebShop brackets, else ALFWorld)."""
    actions = list(actions)
    if any(_search_qa_command(a) for a in actions):
        return _SEARCH_QA
    if any(_webshop_command(a) for a in actions):
        return _WEBSHOP
    return _ALFWORLD


class RuleBasedAnalyzer:
    """The embedded, deterministic analyzer: reads the same JSON payloads and answers in the same JSON format as
    an LLM analyzer would, so its output passes through the same parser and evidence checks.

    It knows ALFWorld, WebShop and Search-QA: the trainers name the rule set of their environment; constructed
    without one, it tells them apart by their action syntax (see the rule sets above). Extraction items are ranked
    by how many successes support them. Alignment keeps an item when every thing its source actions refer to
    (ALFWorld's objects and receptacles, WebShop's products and option values) also appears in the target's own
    records, and quotes the target: its action naming most of those things, else an observation naming them; for an
    item that names nothing, its own action of the same kind, else the task. Step skills (OPID) are the applicable
    items, in item order, each placed at the target's first step still without one whose action is one of the item's
    source actions as the rule set reads them (same kind, same things: "go to fridge 1" for "Go to the fridge before
    ..."), else at the step its quote comes from; at most ``max_step_skills``.
    """

    workers = 1

    def __init__(self, environment: str | None = None) -> None:
        """``environment``: the rule set (``RULE_SETS``) to read every request with; None tells the built-in
        environments apart by each request's action syntax (Search-QA blocks, WebShop brackets, else ALFWorld)."""
        if environment is not None and environment not in RULE_SETS:
            raise ValueError(unknown_rule_set(environment))
        self.environment = environment

    def _rules(self, actions: Iterable[str]) -> _Rules:
        return RULE_SETS[self.environment] if self.environment else _rules_for(actions)

    def complete(self, messages: Messages) -> str:
        """Answer an extraction or alignment request (the last user message holds the JSON payload)."""
        try:
            payload = json.loads(next(m["content"] for m in reversed(messages) if m.get("role") == "user"))
            stage = payload["stage"]
        except (StopIteration, KeyError, TypeError, ValueError) as error:
            raise AnalyzerError(f"rule-based analyzer got no protocol payload: {error}") from error
        if stage == "extraction":
            return json.dumps({"items": self.extract(payload)}, ensure_ascii=False)
        if stage == "alignment":
            return json.dumps(
                {"target_id": payload["target_id"], "statements": self.align(payload)}, ensure_ascii=False
            )
        if stage == "step_skills":
            return json.dumps(
                {"target_id": payload["target_id"], "step_skills": self.step_skills(payload)}, ensure_ascii=False
            )
        raise AnalyzerError(f"rule-based analyzer: unknown stage {stage!r}")

    def extract(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Items (as JSON dicts) from an extraction payload."""
        successes = payload["successes"]
        rules = self._rules(step["action"] for success in successes for step in success["steps"])
        kept = rules.extract(payload["task"].lower(), successes)
        kept.sort(key=lambda c: (-len(c.refs), c.rank))
        return [c.as_item(f"E{n + 1}") for n, c in enumerate(kept[: payload.get("max_items", len(kept))])]

    def align(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Statements (as JSON dicts) for the items that apply to the target's recorded interaction."""
        return [
            {"statement": item["statement"], "evidence_ids": [item["id"]], "target_quote": quote}
            for item, quote, _ in self._applicable(payload)
        ]

    def step_skills(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Step skills (as JSON dicts): each applicable item at the first of its steps that has no skill yet."""
        skills: dict[int, dict[str, Any]] = {}
        for item, _, steps in self._applicable(payload):
            step = next((s for s in steps if s not in skills), None)
            if step is not None and len(skills) < payload["max_step_skills"]:
                skills[step] = {"step": step, "skill": item["statement"], "evidence_ids": [item["id"]]}
        return list(skills.values())

    def _applicable(self, payload: dict[str, Any]) -> list[tuple[dict[str, Any], str, list[int]]]:
        """(item, target quote, the target's steps it bears on) for each item that applies: the steps that take
        one of its source actions, then the step its quote comes from."""
        steps = payload["steps"]
        actions = [s["action"] for s in steps]
        observations = [s["pre_observation"] for s in steps[:1]] + [s["post_observation"] for s in steps]
        records = " ".join([payload["task"], *actions, *observations])
        items = payload["allowed_evidence"]
        rules = self._rules([a for item in items for a in item.get("source_actions", [])] + actions)
        applicable = []
        for item in items:
            sources = item.get("source_actions", [])
            anchors = [names for names in (rules.anchors(a, payload["task"]) for a in sources) if names is not None]
            if not anchors:
                continue  # no source action this rule set understands
            names = list(dict.fromkeys(name for found in anchors for name in found))
            if not all(_mentions(records, name) for name in names):
                continue
            if names:
                quote, step = self._target_quote(names, actions, observations)
            else:
                quote, step = self._same_kind_quote(rules, sources, actions, payload["task"])
            if quote:
                steps = self._steps_taking(rules, sources, actions, payload["task"])
                applicable.append((item, quote, steps + ([step] if step is not None and step not in steps else [])))
        return applicable

    @staticmethod
    def _steps_taking(rules: _Rules, sources: list[str], actions: list[str], task: str) -> list[int]:
        """The target's steps whose action is one of ``sources`` as ``rules`` read them: same kind, same things."""

        def reading(action: str) -> tuple[str, tuple[str, ...]]:
            return rules.kind(action), tuple(rules.anchors(action, task) or ())

        wanted = {reading(a) for a in sources if rules.kind(a)}
        return [n for n, a in enumerate(actions) if ELLIPSIS not in a and reading(a) in wanted]

    @staticmethod
    def _target_quote(names: list[str], actions: list[str], observations: list[str]) -> tuple[str, int | None]:
        """The target's own action naming most of the item's things, else an observation piece naming them; with
        the step of that action, or the step that acted on that observation (None for the final one)."""
        scored = [
            (sum(_mentions(a, name) for name in names), -n, a) for n, a in enumerate(actions) if ELLIPSIS not in a
        ]
        best = max(scored, default=(0, 0, ""))
        if best[0]:
            return best[2], -best[1]
        # observations[k] is what step k acted on; the last one came after the final step.
        for k, observation in enumerate(observations):
            if any(_mentions(observation, name) for name in names):
                return _quote(observation, names), k if k < len(actions) else None
        return "", None

    @staticmethod
    def _same_kind_quote(
        rules: _Rules, sources: list[str], actions: list[str], task: str
    ) -> tuple[str, int | None]:
        """The target's first action of the kind of one of the item's source actions (and its step), else the
        task's first piece (no step)."""
        usable = [(n, a) for n, a in enumerate(actions) if ELLIPSIS not in a]
        for kind in dict.fromkeys(rules.kind(a) for a in sources):
            found = next(((n, a) for n, a in usable if kind and rules.kind(a) == kind), None)
            if found:
                return found[1], found[0]
        return _quote(task, []), None
