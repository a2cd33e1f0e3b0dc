"""Analyzer backends for the A.2 protocol: one small interface, three implementations.

An analyzer turns chat messages into raw text (``complete``); the protocol module parses and validates that
text, so every backend goes through the same checks. ``workers`` says how many requests the builder may run
at once. Failures raise :class:`AnalyzerError`; the builder turns them into empty PI, never a crash.

- :class:`OpenAICompatibleAnalyzer`: the paper's setting (Table C.3: DeepSeek, temperature 0, 4,096 output
  tokens, 4 workers) against any OpenAI-compatible server (DeepSeek, vLLM, ``transformers serve``), with a
  disk cache so reruns and resumed runs see the same answers.
- :class:`TransformersAnalyzer`: a local causal LM, greedy decoding.
- :class:`RuleBasedAnalyzer`: the embedded default, deterministic and model-free, reading with the rules each
  environment registers (``taspo_trl.envs.register_analyzer_rules``: ALFWorld, WebShop and Search-QA have theirs
  in ``envs/<env>/analysis.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..cache_manifest import text_sha256
from ..envs import analyzer_rules_names, get_analyzer_rules
from ..envs.analysis import ELLIPSIS, RuleSet, mentions, short_quote

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

            from ..models import resolve_embedded

            path = resolve_embedded(str(model_or_path))
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
# One deterministic rule set per environment, registered by the environment's name in ``taspo_trl.envs``
# (``register_analyzer_rules``; the built-in ones live in ``envs/<env>/analysis.py``). Each turns verified
# successes into candidate items (extraction) and names what an item's source actions refer to, which the
# target's records must show before the item applies to it (alignment).


def unknown_rule_set(environment: str | None) -> str:
    """Why the rule-based analyzer cannot serve ``environment`` (None: an environment given as a factory), and
    the fix."""
    which = f"environment {environment!r}" if environment else "an environment passed as a factory"
    return (
        f"the rule-based analyzer (analyzer='rule') has rules for {', '.join(map(repr, analyzer_rules_names()))} "
        f"only, not for {which}: set analyzer='openai' (any OpenAI-compatible server) or analyzer='transformers' (a "
        "local model), register rules for your environment with taspo_trl.envs.register_analyzer_rules(), or set "
        "analyzer_rules to one of those names if your environment uses its actions."
    )


def _builtin_rules_for(actions: Iterable[str]) -> RuleSet:
    """The fallback of an analyzer constructed without an environment (``RuleBasedAnalyzer()``): the built-in rule
    set whose action syntax the actions use (Search-QA's blocks, WebShop's brackets, else ALFWorld's). Only the
    three built-in environments are told apart this way; the trainers always name their environment, and an
    environment of your own is read only by the rules registered under its name."""
    from ..envs.alfworld.analysis import ALFWorldRules
    from ..envs.search.analysis import SearchQARules
    from ..envs.webshop.analysis import WebShopRules

    actions = list(actions)
    for rules in (SearchQARules(), WebShopRules()):
        if any(rules.anchors(action, "") is not None for action in actions):
            return rules
    return ALFWorldRules()


class RuleBasedAnalyzer:
    """The embedded, deterministic analyzer: reads the same JSON payloads and answers in the same JSON format as
    an LLM analyzer would, so its output passes through the same parser and evidence checks.

    It reads with the rules registered for an environment (``taspo_trl.envs.register_analyzer_rules``; ALFWorld,
    WebShop and Search-QA come with theirs): the trainers name their environment; constructed without one, it tells
    the three built-in environments apart by their action syntax (``_builtin_rules_for``). Extraction items are ranked
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
        """``environment``: the environment whose registered rules read every request (an environment without
        any is refused, with the fix); None tells the three built-in environments apart by each request's action
        syntax (Search-QA blocks, WebShop brackets, else ALFWorld), a fallback for callers that know no name."""
        if environment is not None and environment not in analyzer_rules_names():
            raise ValueError(unknown_rule_set(environment))
        self.environment = environment
        self._named = get_analyzer_rules(environment) if environment is not None else None

    def _rules(self, actions: Iterable[str]) -> RuleSet:
        return self._named if self._named is not None else _builtin_rules_for(actions)

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
            if not all(mentions(records, name) for name in names):
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
    def _steps_taking(rules: RuleSet, sources: list[str], actions: list[str], task: str) -> list[int]:
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
            (sum(mentions(a, name) for name in names), -n, a) for n, a in enumerate(actions) if ELLIPSIS not in a
        ]
        best = max(scored, default=(0, 0, ""))
        if best[0]:
            return best[2], -best[1]
        # observations[k] is what step k acted on; the last one came after the final step.
        for k, observation in enumerate(observations):
            if any(mentions(observation, name) for name in names):
                return short_quote(observation, names), k if k < len(actions) else None
        return "", None

    @staticmethod
    def _same_kind_quote(
        rules: RuleSet, sources: list[str], actions: list[str], task: str
    ) -> tuple[str, int | None]:
        """The target's first action of the kind of one of the item's source actions (and its step), else the
        task's first piece (no step)."""
        usable = [(n, a) for n, a in enumerate(actions) if ELLIPSIS not in a]
        for kind in dict.fromkeys(rules.kind(a) for a in sources):
            found = next(((n, a) for n, a in usable if kind and rules.kind(a) == kind), None)
            if found:
                return found[1], found[0]
        return short_quote(task, []), None
