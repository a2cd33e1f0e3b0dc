"""Search-QA in the Search-R1 protocol: one episode answers one question with up to ``max_turns`` actions.

Each action is either ``<search>query</search>``, answered with the top documents as
``<information>Doc 1(Title: ...) text\\nDoc 2(Title: ...) text</information>``, or ``<answer>text</answer>``,
which ends the episode with reward = exact match (SQuAD normalisation) against any gold answer. Anything else
(no block, an empty or unreadable query, a retrieval failure) gets an ordinary observation that says what is
valid; the environment never raises on model text or on a failing retriever.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from ..base import StepResult
from .retrieval import EMBEDDED, Document, Retriever, get_retriever
from .scoring import exact_match

logger = logging.getLogger(__name__)

MAX_QUERY_CHARS = 256
DEFAULT_TOPK = 3
DEFAULT_MAX_TURNS = 4
_BLOCK = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_VALID_FORMAT = (
    "Valid actions are <search> query </search> to look something up and <answer> short answer </answer> to "
    "give the final answer."
)


def parse_search_action(action: Any) -> tuple[str, str]:
    """(kind, content) of the first complete ``<search>``/``<answer>`` block: kind is ``"search"``,
    ``"answer"`` or ``"invalid"`` (content then says why). Accepts the canonical block and raw model text."""
    if not isinstance(action, str) or not action.strip():
        return "invalid", "no action"
    match = _BLOCK.search(action)
    if match is None:
        return "invalid", "no <search> or <answer> block"
    return match.group(1).lower(), match.group(2).strip()


def clean_query(query: str) -> tuple[str, bool]:
    """The query with control and unprintable characters removed and whitespace collapsed, cut to
    ``MAX_QUERY_CHARS`` at a word boundary; the flag says whether it was cut. Non-ASCII letters are kept
    (real corpora have them); a query without any known word simply finds nothing."""
    text = unicodedata.normalize("NFKC", query)
    text = "".join(ch if not unicodedata.category(ch).startswith("C") else " " for ch in text)
    text = " ".join(text.split())
    if len(text) <= MAX_QUERY_CHARS:
        return text, False
    cut = text[:MAX_QUERY_CHARS]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut), True


def format_documents(docs: Sequence[Document]) -> str:
    """Search-R1's observation: ``<information>Doc 1(Title: T) text ...</information>``."""
    if not docs:
        return "<information>No documents matched this query. Try other keywords.</information>"
    lines = [f"Doc {i}(Title: {d.title}) {d.text}" for i, d in enumerate(docs, 1)]
    return "<information>" + "\n".join(lines) + "</information>"


class SearchQAEnv:
    """One episode of one question, following :class:`taspo_trl.envs.base.AgentEnv`.

    ``task_type`` is the dataset name (``nq``, ``hotpotqa``, ..., or ``embedded_single`` /
    ``embedded_multi`` for the shipped fictional encyclopedia). Every step, valid or not, uses one of the
    ``max_turns`` turns; the episode ends on the first answer (right or wrong) or after ``max_turns`` steps
    (``info["truncated"]``). ``info["score"]`` is the exact match of the answer (0.0 before one).
    """

    env_name = "search"
    action_tag = "answer"
    action_tags = ("search", "answer")

    def __init__(
        self,
        question: str,
        golden_answers: Sequence[str],
        retriever: Retriever,
        topk: int = DEFAULT_TOPK,
        max_turns: int = DEFAULT_MAX_TURNS,
        task_type: str = "search",
    ) -> None:
        if not isinstance(question, str) or not question.strip():
            raise ValueError("Search-QA task needs a non-empty 'question'.")
        answers = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ValueError(f"Search-QA task needs 'golden_answers', a non-empty list of strings; got {golden_answers!r}.")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.question = question.strip()
        self.golden_answers = answers
        self.retriever = retriever
        self.topk = int(topk)
        self.max_turns = int(max_turns)
        self.task_type = task_type
        self.instructions = (
            "To look something up, write <search> query </search>; the results come back inside "
            "<information> ... </information>. You may search several times, but you have at most "
            f"{self.max_turns} actions in all. When you know the answer, write it as <answer> short answer "
            "</answer>, e.g. <answer> Paris </answer>."
        )
        self._turns = 0
        self._done = False
        self._truncated = False
        self._score = 0.0
        self._last_observation = ""

    @property
    def task(self) -> str:
        return self.question

    @property
    def admissible_commands(self) -> None:
        """Open action space: any query or answer."""
        return None

    @property
    def turns(self) -> int:
        """Steps taken since the last reset."""
        return self._turns

    def reset(self) -> str:
        self._turns, self._done, self._truncated, self._score = 0, False, False, 0.0
        # The question is already the task line of the prompt; repeating it here would only cost tokens.
        self._last_observation = "Nothing retrieved yet."
        return self._last_observation

    def step(self, action: str) -> StepResult:
        """One action; never raises for any text or retriever failure."""
        return SearchQAEnv.step_many([self], [action])[0]

    @staticmethod
    def step_many(envs: Sequence[SearchQAEnv], actions: Sequence[str]) -> list[StepResult]:
        """Step several episodes at once with ONE ``retrieve`` call per (retriever, topk) among their searches,
        i.e. one request per turn for a batch that shares a retrieval server."""
        if len(envs) != len(actions):
            raise ValueError(f"step_many got {len(envs)} envs and {len(actions)} actions.")
        results: list[StepResult | None] = [None] * len(envs)
        searches: dict[tuple[int, int], list[tuple[int, str, bool]]] = {}
        for i, (env, action) in enumerate(zip(envs, actions)):
            planned = env._plan(action)
            if isinstance(planned, StepResult):
                results[i] = planned
            else:
                query, cut = planned
                searches.setdefault((id(env.retriever), env.topk), []).append((i, query, cut))
        for group in searches.values():
            first = envs[group[0][0]]
            try:
                found = first.retriever.retrieve([query for _, query, _ in group], first.topk)
                if len(found) != len(group):
                    raise RuntimeError(f"retriever returned {len(found)} result lists for {len(group)} queries")
                outcomes: list[list[Document] | str] = list(found)
            except Exception as error:  # noqa: BLE001 - any retriever failure becomes an observation, by contract
                logger.warning("retrieval failed for %d queries: %s", len(group), error)
                outcomes = [f"{type(error).__name__}: {error}"] * len(group)
            for (i, _, cut), outcome in zip(group, outcomes):
                results[i] = envs[i]._after_search(outcome, cut)
        return [r for r in results if r is not None]

    def _plan(self, action: str) -> StepResult | tuple[str, bool]:
        """A finished result for answers, invalid actions and finished episodes, or (query, was_cut)."""
        if self._done:
            return StepResult(self._last_observation, 0.0, True, self._info(self._truncated))
        kind, content = parse_search_action(action)
        if kind == "answer" and content:
            self._turns += 1
            self._score = exact_match(content, self.golden_answers)
            shown = content if len(content) <= MAX_QUERY_CHARS else content[:MAX_QUERY_CHARS] + " ..."
            return self._finish(f"Your answer was: {shown}", reward=self._score, done=True)
        if kind == "search":
            query, cut = clean_query(content)
            if query:
                return query, cut
            reason = "the search query was empty"
        elif kind == "answer":
            reason = "the answer was empty"
        else:
            reason = "the response had no complete <search> or <answer> block"
        self._turns += 1
        return self._finish(f"Invalid action: {reason}. {_VALID_FORMAT}", reward=0.0, done=False)

    def _after_search(self, outcome: list[Document] | str, cut: bool) -> StepResult:
        self._turns += 1
        if isinstance(outcome, str):
            observation = f"<information>retrieval failed: {outcome}. You can search again or answer.</information>"
        else:
            observation = format_documents(outcome)
        if cut:
            observation = f"(Your query was cut to its first {MAX_QUERY_CHARS} characters.)\n{observation}"
        result = self._finish(observation, reward=0.0, done=False)
        if isinstance(outcome, str):
            result.info["retrieval_error"] = outcome
        return result

    def _finish(self, observation: str, reward: float, done: bool) -> StepResult:
        truncated = not done and self._turns >= self.max_turns
        self._done, self._truncated = done or truncated, truncated
        self._last_observation = observation
        return StepResult(observation, reward, self._done, self._info(truncated))

    def _info(self, truncated: bool) -> dict[str, Any]:
        return {"won": self._score == 1.0, "score": self._score, "truncated": truncated, "turn": self._turns}

    def close(self) -> None:
        """Nothing to release: the retriever is shared by the whole process."""


def search_env_factory(spec: Mapping[str, Any]) -> SearchQAEnv:
    """The agent loop's ``EnvFactory``. Spec keys: ``question`` (or ``task``), ``golden_answers``,
    ``task_type``/``data_source``, ``retriever`` (``"embedded"``, ``"embedded:/path/corpus.jsonl"`` or the
    server's http URL), ``topk`` (3), ``max_turns`` (4), ``timeout`` (10 s), ``retries`` (2), ``backoff`` (0.5 s)."""
    question = spec.get("question", spec.get("task"))
    if not question:
        raise ValueError(f"Search-QA task spec needs a 'question' key, got keys {sorted(spec)}.")
    if "golden_answers" not in spec:
        raise ValueError(f"Search-QA task spec needs a 'golden_answers' key, got keys {sorted(spec)}.")
    retriever = get_retriever(
        str(spec.get("retriever", EMBEDDED)),
        timeout=float(spec.get("timeout", 10.0)),
        retries=int(spec.get("retries", 2)),
        backoff=float(spec.get("backoff", 0.5)),
    )
    return SearchQAEnv(
        question,
        spec["golden_answers"],
        retriever,
        topk=int(spec.get("topk", DEFAULT_TOPK)),
        max_turns=int(spec.get("max_turns", DEFAULT_MAX_TURNS)),
        task_type=str(spec.get("task_type") or spec.get("data_source") or "search"),
    )
