"""What an environment's rules for the rule-based analyzer (``analyzer: rule``) are written with.

The rule-based analyzer (``taspo_trl.privileged.analyzers.RuleBasedAnalyzer``) answers the A.2 protocol's
requests without a model, through one ``RuleSet`` per environment: ``extract`` turns the verified successes of an
extraction payload into candidate items, ``anchors`` names what an action refers to (which a target's records must
show before an item applies to it) and ``kind`` says what sort of action it is. Each environment's rule set lives
with the environment (``envs/alfworld/analysis.py``, ``envs/webshop/analysis.py``, ``envs/search/analysis.py``)
and is registered by name with ``taspo_trl.envs.register_analyzer_rules``, as its expert is with
``register_expert``. This module holds what they share: the steps of a success, the items under construction and
verbatim quoting of the payload's compacted records. It imports nothing from ``privileged/``, so that the rule
sets under ``envs/`` need not either.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

# The A.2 protocol's elision marker in compacted records and its cap on a statement's length
# (``privileged/protocol.py`` uses them from here).
ELLIPSIS = " ... "
MAX_STATEMENT_CHARS = 800

QUOTE_CHARS = 160


def mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text.lower()) is not None


# Where quotable pieces end: sentence ends, WebShop's " [SEP] " between page texts, and Search-QA's
# "<information>" wrapper and "Doc 2(Title: T)" headers (a quote then holds what a document says, not its header).
_PIECE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*\[SEP\]\s*|\s*</?information>\s*|\s*Doc \d+\(Title: [^)]*\)\s*")


def quotable_pieces(field: str) -> list[str]:
    """Quotable pieces of a compacted field (sentences, page texts) that never straddle an elision gap."""
    pieces = []
    for segment in field.split(ELLIPSIS):
        pieces += [s.strip() for s in _PIECE_BREAK.split(segment) if s.strip()]
    return pieces


def naming_quote(field: str, names: Iterable[str]) -> str:
    """The first piece of ``field`` naming one of ``names`` (in the order of ``names``), or ""."""
    sentences = quotable_pieces(field)
    for name in names:
        for sentence in sentences:
            if mentions(sentence, name):
                return sentence[:QUOTE_CHARS].strip()
    return ""


def short_quote(field: str, names: Iterable[str]) -> str:
    """A short verbatim quote of ``field``: the first piece naming one of ``names``, else its first piece."""
    sentences = quotable_pieces(field)
    return naming_quote(field, names) or (sentences[0][:QUOTE_CHARS].strip() if sentences else "")


@dataclass
class Step:
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
        post = naming_quote(self.post, names)
        pre = "" if post else naming_quote(self.pre, names)
        if not (post or pre):
            post = short_quote(self.post, names)
            pre = "" if post else short_quote(self.pre, names)
        quote = {"post_observation_quote": post} if post else {"pre_observation_quote": pre}
        return {"trajectory_id": self.trajectory_id, "step": self.step, "action_quote": self.action, **quote}


def effective_steps(success: dict[str, Any], parse: Callable[[str], Any], failed: str) -> list[Step]:
    """The steps of ``success`` whose action ``parse`` understands and whose answer does not start ``failed``."""
    steps = []
    for raw in success["steps"]:
        command = parse(raw["action"])
        if command is not None and not raw["post_observation"].lower().startswith(failed):
            steps.append(
                Step(success["trajectory_id"], raw["step"], raw["action"], command, raw["pre_observation"],
                     raw["post_observation"])
            )
    return steps


class Candidate:
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


Candidates = dict[tuple, Candidate]


def add_candidate(candidates: Candidates, key: tuple, kind: str, statement: str) -> Candidate:
    return candidates.setdefault(key, Candidate(kind, statement, len(candidates)))


class RuleSet(Protocol):
    """One environment family's rules: ``extract`` returns the candidates of an extraction payload's successes,
    ``anchors`` the things an action refers to (None when the action is not one of this family's), ``kind`` the
    sort of action it is (a target's action of the same kind is quoted when an item names nothing)."""

    def extract(self, task: str, successes: list[dict[str, Any]]) -> list[Candidate]: ...

    def anchors(self, action: str, task: str) -> list[str] | None: ...

    def kind(self, action: str) -> str: ...


__all__ = [
    "ELLIPSIS",
    "MAX_STATEMENT_CHARS",
    "QUOTE_CHARS",
    "Candidate",
    "Candidates",
    "RuleSet",
    "Step",
    "add_candidate",
    "effective_steps",
    "mentions",
    "naming_quote",
    "quotable_pieces",
    "short_quote",
]
