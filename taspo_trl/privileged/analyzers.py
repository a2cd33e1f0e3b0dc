"""Analyzer backends for the A.2 protocol: one small interface, three implementations.

An analyzer turns chat messages into raw text (``complete``); the protocol module parses and validates that
text, so every backend goes through the same checks. ``workers`` says how many requests the builder may run
at once. Failures raise :class:`AnalyzerError`; the builder turns them into empty PI, never a crash.

- :class:`OpenAICompatibleAnalyzer`: the paper's setting (Table C.3: DeepSeek, temperature 0, 4,096 output
  tokens, 4 workers) against any OpenAI-compatible server (DeepSeek, vLLM, ``transformers serve``), with a
  disk cache so reruns and resumed runs see the same answers.
- :class:`TransformersAnalyzer`: a local causal LM, greedy decoding.
- :class:`RuleBasedAnalyzer`: the embedded default, deterministic and model-free, for ALFWorld-style commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .protocol import ELLIPSIS, MAX_STATEMENT_CHARS

Messages = list[dict[str, str]]


class AnalyzerError(RuntimeError):
    """An analyzer could not produce an answer (connection, timeout, HTTP error, empty reply, model failure)."""


@runtime_checkable
class Analyzer(Protocol):
    """Chat messages in, raw text out; ``workers`` = how many ``complete`` calls may run concurrently."""

    workers: int

    def complete(self, messages: Messages) -> str: ...


# ----------------------------------------------------------------------------------------------- OpenAI-compatible


class OpenAICompatibleAnalyzer:
    """An OpenAI-compatible chat-completions endpoint, through the official ``openai`` client.

    ``timeout`` (seconds) and ``max_retries`` go to the client, which retries timeouts, connection errors, 429s
    and 5xx with backoff. With ``cache_dir`` every answer is stored under a hash of the request (model,
    messages, temperature, max_tokens), and a repeated request is answered from disk without contacting the
    server. ``requests`` / ``cache_hits`` / ``failures`` count calls (thread-safe).
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
    ) -> None:
        from openai import OpenAI

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.workers = workers
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # Local servers (vLLM, transformers serve) accept any key, but the client insists on one.
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._client = OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries)
        self._lock = threading.Lock()
        self.requests = 0
        self.cache_hits = 0
        self.failures = 0

    def request_key(self, messages: Messages) -> str:
        """The cache key of a request: SHA-256 of its model, messages and sampling parameters."""
        request = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
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
                model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens
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
        path = self._cache_path(key)
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))["text"]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a damaged entry is simply asked again and overwritten

    def _write_cache(self, key: str, text: str) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader or a killed run never sees half an entry.
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump({"model": self.model, "text": text}, handle, ensure_ascii=False)
        os.replace(handle.name, path)


# ----------------------------------------------------------------------------------------------- local transformers


class TransformersAnalyzer:
    """A local causal LM with a chat template, decoding greedily (the paper's analyzer runs at temperature 0).

    ``model_or_path`` is a loaded model (then pass ``tokenizer``) or a path / hub id / ``"embedded"``.
    Generation is serialised: one model instance serves one request at a time.
    """

    workers = 1

    def __init__(self, model_or_path: Any, tokenizer: Any = None, max_new_tokens: int = 4096) -> None:
        if isinstance(model_or_path, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from taspo_trl.models import resolve_model_path

            path = resolve_model_path(str(model_or_path))
            model_or_path = AutoModelForCausalLM.from_pretrained(path)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        if tokenizer is None:
            raise ValueError("TransformersAnalyzer needs the tokenizer when given a loaded model.")
        self.model = model_or_path.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()

    def complete(self, messages: Messages) -> str:
        """Greedy continuation of the chat-templated ``messages``. Raises :class:`AnalyzerError`."""
        import torch

        try:
            inputs = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            ).to(self.model.device)
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
_QUOTE_CHARS = 160


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


def _mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text.lower()) is not None


def _sentences(field: str) -> list[str]:
    """Quotable pieces of a compacted field: sentences that never straddle an elision gap."""
    pieces = []
    for segment in field.split(ELLIPSIS):
        pieces += [s.strip() for s in re.split(r"(?<=[.!?])\s+", segment) if s.strip()]
    return pieces


def _quote(field: str, names: Iterable[str]) -> str:
    """A short verbatim quote of ``field``: the first sentence naming one of ``names``, else its first sentence."""
    sentences = _sentences(field)
    for name in names:
        for sentence in sentences:
            if _mentions(sentence, name):
                return sentence[:_QUOTE_CHARS].strip()
    return sentences[0][:_QUOTE_CHARS].strip() if sentences else ""


@dataclass
class _Step:
    trajectory_id: int
    step: int
    action: str
    command: Command
    pre: str
    post: str

    def reference(self, names: Iterable[str]) -> dict[str, Any]:
        """A citation of this step: the action, and the observation it produced (or, if empty, the one before)."""
        names = list(names)
        post = _quote(self.post, names)
        quote = {"post_observation_quote": post} if post else {"pre_observation_quote": _quote(self.pre, names)}
        return {"trajectory_id": self.trajectory_id, "step": self.step, "action_quote": self.action, **quote}


def _phrase(command: Command) -> str:
    obj, rec = entity_type(command.obj), entity_type(command.rec)
    return {
        "take": f"take the {obj} from the {rec}",
        "put": f"put the {obj} in/on the {rec}",
        "use": f"use the {obj}",
    }.get(command.verb, f"{command.verb} the {obj} with the {rec}")


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


class RuleBasedAnalyzer:
    """The embedded, deterministic analyzer: reads the same JSON payloads and answers in the same JSON format as
    an LLM analyzer would, so its output passes through the same parser and evidence checks.

    Extraction, from the successes' effective actions (not answered "Nothing happens.") on things the task
    names ("key actions": take / move / heat / cool / clean / slice / use):
      (a) requirements: each key action the successes performed;
      (b) preconditions: the "go to R" and "open R" that preceded a key action on receptacle R;
      (c) ordering: consecutive key actions, in the order the successes did them (pairs some success
          reversed are dropped).
    Items are ranked by how many successes support them. Alignment keeps an item when every object and
    receptacle named in its source actions also appears in the target's own records, quoting the target.
    """

    workers = 1

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
        raise AnalyzerError(f"rule-based analyzer: unknown stage {stage!r}")

    # ---- extraction

    def extract(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Items (as JSON dicts) from an extraction payload."""
        task = payload["task"].lower()
        candidates: dict[tuple, _Candidate] = {}
        reversed_pairs: set[tuple] = set()
        for success in payload["successes"]:
            steps = self._steps(success)
            keys = [s for s in steps if s.command.verb in _KEY_VERBS and self._on_task(s.command, task)]
            for step in keys:
                self._requirement(candidates, step)
                self._preconditions(candidates, step, steps)
            self._orderings(candidates, reversed_pairs, keys)
        kept = [c for key, c in candidates.items() if key not in reversed_pairs]
        kept.sort(key=lambda c: (-len(c.refs), c.rank))
        return [c.as_item(f"E{n + 1}") for n, c in enumerate(kept[: payload.get("max_items", len(kept))])]

    @staticmethod
    def _steps(success: dict[str, Any]) -> list[_Step]:
        steps = []
        for raw in success["steps"]:
            command = parse_command(raw["action"])
            if command is not None and not raw["post_observation"].lower().startswith(_FAILED):
                steps.append(
                    _Step(
                        success["trajectory_id"],
                        raw["step"],
                        raw["action"],
                        command,
                        raw["pre_observation"],
                        raw["post_observation"],
                    )
                )
        return steps

    @staticmethod
    def _on_task(command: Command, task: str) -> bool:
        return any(_mentions(task, entity_type(name)) for name in command.entities)

    @staticmethod
    def _add(candidates: dict[tuple, _Candidate], key: tuple, kind: str, statement: str) -> _Candidate:
        return candidates.setdefault(key, _Candidate(kind, statement, len(candidates)))

    def _requirement(self, candidates: dict[tuple, _Candidate], step: _Step) -> None:
        c = step.command
        statement = f'Required: {_phrase(c)} ("{step.action}").'
        key = ("requirement", c.verb, entity_type(c.obj), entity_type(c.rec))
        self._add(candidates, key, "requirement", statement).support(step.trajectory_id, [step.reference(c.entities)])

    def _preconditions(self, candidates: dict[tuple, _Candidate], step: _Step, steps: list[_Step]) -> None:
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
            self._add(candidates, key, "precondition", statement).support(step.trajectory_id, refs)

    def _orderings(self, candidates: dict[tuple, _Candidate], reversed_pairs: set[tuple], keys: list[_Step]) -> None:
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
            self._add(candidates, ("ordering", sig_a, sig_b), "ordering", statement).support(a.trajectory_id, refs)

    # ---- alignment

    def align(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Statements (as JSON dicts) for the items that apply to the target's recorded interaction."""
        steps = payload["steps"]
        actions = [s["action"] for s in steps]
        observations = [s["pre_observation"] for s in steps[:1]] + [s["post_observation"] for s in steps]
        records = " ".join([payload["task"], *actions, *observations])
        statements = []
        for item in payload["allowed_evidence"]:
            names = self._entities(item.get("source_actions", []))
            if not names or not all(_mentions(records, name) for name in names):
                continue
            quote = self._target_quote(names, actions, observations)
            if quote:
                statements.append({"statement": item["statement"], "evidence_ids": [item["id"]], "target_quote": quote})
        return statements

    @staticmethod
    def _entities(source_actions: list[str]) -> list[str]:
        commands = [parse_command(action) for action in source_actions]
        return list(dict.fromkeys(name for c in commands if c is not None for name in c.entities))

    @staticmethod
    def _target_quote(names: list[str], actions: list[str], observations: list[str]) -> str:
        """The target's own action naming most of the item's things, else an observation sentence naming them."""
        scored = [
            (sum(_mentions(a, name) for name in names), -n, a) for n, a in enumerate(actions) if ELLIPSIS not in a
        ]
        best = max(scored, default=(0, 0, ""))
        if best[0]:
            return best[2]
        for observation in observations:
            if any(_mentions(observation, name) for name in names):
                return _quote(observation, names)
        return ""
