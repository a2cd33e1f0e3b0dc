"""Search-QA's rules for the rule-based analyzer (``analyzer: rule``), registered as ``"search"`` in
``taspo_trl.envs``: the canonical ``<search>...</search>`` / ``<answer>...</answer>`` blocks and the searches that
led to each success's answer."""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

from ..analysis import QUOTE_CHARS, Candidate, Candidates, Step, add_candidate, effective_steps, quotable_pieces
from .env import parse_search_action
from .scoring import normalize_answer

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


class SearchQARules:
    """From each success's answer and the searches that led to it:
      requirements: the search whose results hold the answer (the first one that retrieved it) and, going back,
          each earlier search whose results named the words a later query added to the question (the hops of a
          multi-hop question); what was learned: the retrieved document's sentence that states the answer,
          and the answer itself;
      ordering: consecutive hops.
    Every sibling faces the same question over the same corpus with an open action space, so nothing needs
    anchoring in its records: each item applies, quoting the target's own search or answer."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[Candidate]:
        candidates: Candidates = {}
        question = _words(task)
        for success in successes:
            steps = effective_steps(success, _search_qa_command, _SEARCH_QA_INVALID)
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
                add_candidate(candidates, key, "requirement", statement).support(step.trajectory_id, [step.reference(names)])
            for a, b in pairwise(chain):
                qa, qb = a.command[1], b.command[1]
                statement = f'Search for "{qa}" before you search for "{qb}" ("{a.action}", then "{b.action}").'
                key = ("ordering", tuple(sorted(_words(qa))), tuple(sorted(_words(qb))))
                refs = [a.reference([]), b.reference([])]
                add_candidate(candidates, key, "ordering", statement).support(a.trajectory_id, refs)
            statement, refs = f'Answer "{text}" ("{answer.action}").', [answer.reference([])]
            if found is not None:
                sentence = next((s for s in quotable_pieces(found.post) if _holds(s, text)), "")[:QUOTE_CHARS].strip()
                titles = _DOC_TITLE.findall(found.post[: found.post.find(sentence)]) if sentence else []
                source = f'"{titles[-1]}"' if titles else "a document"
                statement = (
                    f'The search "{found.command[1]}" retrieved {source}, which says: "{sentence}" So the answer is '
                    f'"{text}" ("{answer.action}").'
                )
                refs = [found.reference([text.lower()]), *refs]
            key = ("answer", normalize_answer(text))
            add_candidate(candidates, key, "requirement", statement).support(answer.trajectory_id, refs)
        return list(candidates.values())

    def anchors(self, action: str, task: str) -> list[str] | None:
        return None if _search_qa_command(action) is None else []

    def kind(self, action: str) -> str:
        command = _search_qa_command(action)
        return command[0] if command else ""

    @staticmethod
    def _hops(found: Step, searches: list[Step], question: set[str]) -> list[Step]:
        """``found`` and, going back, the latest earlier search whose results name every word the next query
        adds to the question."""
        chain = [found]
        while True:
            added = _words(chain[0].command[1]) - question
            earlier = [s for s in searches if s.step < chain[0].step and added and added <= _words(s.post)]
            if not earlier:
                return chain
            chain.insert(0, earlier[-1])



__all__ = ["SearchQARules"]
