"""SkillBank: short, reusable skills stored as JSONL, retrieved by sentence-encoder similarity to the task.

One bank and one retriever serve every skill-conditioned method (AlignOPSD's privileged information p_x, the
``generic_skill`` PI source of TASPO's Table 2 ablation, Skill-GRPO, SDAR, ...).

File format (UTF-8 JSON Lines, one skill per line; blank lines are skipped)::

    {"id": "alf-heat-microwave", "env": "alfworld", "task_types": ["pick_heat_then_place_in_recep"],
     "title": "Heat with the microwave", "skill": "Hold the object, go to the microwave and ..."}

``id`` (unique), ``env``, ``title`` and ``skill`` are non-empty strings; ``task_types`` is an optional list of
task-type names (absent or empty: the skill applies to every task type); an optional ``meta`` object is kept but
unused. Any other key is rejected (it is usually a typo such as ``task_type``). Loading validates every line and
raises :class:`SkillBankError` naming the file, the line number and the problem.

Retrieval (:meth:`SkillBank.retrieve`): cosine similarity between the encoder embedding of the task text and that
of each skill's ``"title: skill"`` text (the bank is embedded once and cached), restricted to the skills that apply
to the task type when one is given; the top ``k`` come back best first, ties (scores equal to 1e-6) broken by
bank order, so the result is deterministic. When the task text contains ALFWorld's "Your task is to:" line, only
the goal after it is used as the query (the room description before it would otherwise dominate the embedding).

Shipped banks: ``SkillBank.load("alfworld" | "webshop" | "searchqa")``; any other string is a file path.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from ..jsonl import json_lines
from .encoder import SentenceEncoder, get_encoder

SHIPPED_BANKS = ("alfworld", "webshop", "searchqa")
SKILLS_HEADER = "[Skills]"
SKILLS_FOOTER = "[End Skills]"
_REQUIRED_KEYS = ("id", "env", "title", "skill")
_ALLOWED_KEYS = frozenset({*_REQUIRED_KEYS, "task_types", "meta"})
_TIE_DECIMALS = 6
_TASK_MARKER = re.compile(r"your task is to\s*:\s*", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


class SkillBankError(ValueError):
    """An invalid skill bank (file, line number and problem in the message)."""


@dataclass(frozen=True)
class Skill:
    """One bank entry; ``skill`` is the text inserted as privileged information."""

    id: str
    env: str
    title: str
    skill: str
    task_types: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def applies_to(self, task_type: str | None) -> bool:
        """True when the skill is general (no task types) or lists ``task_type``; any skill when it is None."""
        return task_type is None or not self.task_types or task_type in self.task_types

    @property
    def text(self) -> str:
        """The text that is embedded for retrieval and rendered: ``"title: skill"``."""
        return f"{_one_line(self.title)}: {_one_line(self.skill)}"

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"id": self.id, "env": self.env}
        if self.task_types:
            record["task_types"] = list(self.task_types)
        record["title"] = self.title
        record["skill"] = self.skill
        if self.meta:
            record["meta"] = dict(self.meta)
        return record


def _one_line(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _record_problem(record: Any) -> str | None:
    """What is wrong with one parsed line, or None."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for key in _REQUIRED_KEYS:
        if key not in record:
            return f"missing key {key!r}"
    unknown = sorted(set(record) - _ALLOWED_KEYS)
    if unknown:
        return f"unknown key(s) {', '.join(map(repr, unknown))} (allowed: {', '.join(sorted(_ALLOWED_KEYS))})"
    for key in _REQUIRED_KEYS:
        if not _is_text(record[key]):
            what = "empty" if isinstance(record[key], str) else f"not a string ({type(record[key]).__name__})"
            return f"{key!r} is {what}"
    task_types = record.get("task_types")
    if task_types is not None and (
        not isinstance(task_types, list) or not all(_is_text(task_type) for task_type in task_types)
    ):
        return "'task_types' must be a list of non-empty strings"
    if "meta" in record and not isinstance(record["meta"], dict):
        return "'meta' must be a JSON object"
    return None


def _skill_from_record(record: dict[str, Any]) -> Skill:
    return Skill(
        id=record["id"].strip(),
        env=record["env"].strip(),
        title=record["title"].strip(),
        skill=record["skill"].strip(),
        task_types=tuple(task_type.strip() for task_type in record.get("task_types") or ()),
        meta=dict(record.get("meta") or {}),
    )


def parse_skills(lines: Sequence[str] | str, source: str = "<memory>") -> list[Skill]:
    """Validate and parse JSONL text (or its lines); errors read ``"<source>:<line>: <problem>"``."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    skills: list[Skill] = []
    seen: dict[str, int] = {}
    try:
        records = list(json_lines(lines, source))
    except ValueError as error:
        raise SkillBankError(str(error)) from None
    for number, record in records:
        problem = _record_problem(record)
        if problem is None and record["id"].strip() in seen:
            problem = f"duplicate id {record['id'].strip()!r} (first on line {seen[record['id'].strip()]})"
        if problem:
            raise SkillBankError(f"{source}:{number}: {problem}")
        skill = _skill_from_record(record)
        seen[skill.id] = number
        skills.append(skill)
    return skills


def _shipped_resource(name: str) -> Any:
    if name not in SHIPPED_BANKS:
        raise KeyError(f"no shipped skill bank {name!r}; shipped: {', '.join(SHIPPED_BANKS)}")
    return resources.files("taspo_trl").joinpath("data", "skillbanks", f"{name}.jsonl")


def shipped_bank_path(name: str) -> Path:
    """Filesystem path of a shipped bank (``"alfworld"``, ``"webshop"`` or ``"searchqa"``); to copy and edit."""
    return Path(str(_shipped_resource(name)))


def render_skills(skills: Sequence[Skill], header: bool = True) -> str:
    """The privileged block: ``[Skills]`` / one ``- title: skill`` line per skill / ``[End Skills]``.

    ``header=False`` gives the bullet lines alone (for callers that wrap PI themselves). No skills gives "".
    """
    if not skills:
        return ""
    body = "\n".join(f"- {skill.text}" for skill in skills)
    return f"{SKILLS_HEADER}\n{body}\n{SKILLS_FOOTER}" if header else body


def task_query(task_text: str) -> str:
    """The retrieval query for a task text: the goal after ALFWorld's last "Your task is to:" when present."""
    parts = _TASK_MARKER.split(task_text)
    goal = parts[-1].strip() if len(parts) > 1 else ""
    return _one_line(goal or task_text)


class SkillBank:
    """An in-memory skill bank with cached embeddings and top-k retrieval.

    ``encoder``: a :class:`SentenceEncoder` (default: the shared embedded encoder from :func:`get_encoder`, made
    on first retrieval). ``default_k``: the number of skills :meth:`skill_lookup` renders.
    """

    def __init__(
        self,
        skills: Sequence[Skill],
        encoder: SentenceEncoder | None = None,
        source: str = "<memory>",
        default_k: int = 2,
    ) -> None:
        ids = [skill.id for skill in skills]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise SkillBankError(f"{source}: duplicate id(s) {', '.join(map(repr, duplicates))}")
        self.skills: tuple[Skill, ...] = tuple(skills)
        self.source = source
        self.default_k = default_k
        self._encoder = encoder
        self._embeddings: torch.Tensor | None = None
        self._index = {skill.id: position for position, skill in enumerate(self.skills)}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------- construction
    @classmethod
    def load(
        cls,
        path_or_name: str | os.PathLike,
        encoder: SentenceEncoder | None = None,
        env: str | None = None,
        default_k: int = 2,
    ) -> SkillBank:
        """Load and validate a bank: a shipped name (``alfworld``, ``webshop``, ``searchqa``) or a JSONL path.

        ``env`` keeps only that environment's skills (e.g. from a combined file).
        """
        if isinstance(path_or_name, str) and path_or_name in SHIPPED_BANKS:
            path: Any = _shipped_resource(path_or_name)
        else:
            path = Path(path_or_name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"Skill bank not found: {path} (shipped banks: {', '.join(SHIPPED_BANKS)}; anything else is a path)"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            line = path.read_bytes()[: error.start].count(b"\n") + 1
            raise SkillBankError(
                f"{path}:{line}: not UTF-8 text (byte {error.start}); save the skill bank as UTF-8 JSONL"
            ) from None
        skills = parse_skills(text.splitlines(), source=str(path))
        if env is not None:
            skills = [skill for skill in skills if skill.env == env]
        if not skills:
            scope = f" for environment {env!r}" if env is not None else ""
            raise SkillBankError(
                f"{path} holds no skills{scope}; add JSONL lines such as "
                '{"id": "...", "env": "alfworld", "title": "...", "skill": "..."}, '
                "or leave skill_bank unset to train without skills"
            )
        return cls(skills, encoder=encoder, source=str(path), default_k=default_k)

    @classmethod
    def from_records(
        cls,
        records: Sequence[dict[str, Any]],
        encoder: SentenceEncoder | None = None,
        source: str = "<records>",
    ) -> SkillBank:
        """A bank from dicts in the file format (validated alike; line numbers count records from 1)."""
        return cls(
            parse_skills([json.dumps(r) for r in records], source=source),
            encoder=encoder,
            source=source,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the bank as JSONL (loads back identically)."""
        lines = [json.dumps(skill.to_dict(), ensure_ascii=False) for skill in self.skills]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")

    # ------------------------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.skills)

    def __iter__(self) -> Iterator[Skill]:
        return iter(self.skills)

    def __getitem__(self, skill_id: str) -> Skill:
        return self.skills[self._index[skill_id]]

    def __contains__(self, skill_id: object) -> bool:
        return skill_id in self._index

    def __repr__(self) -> str:
        return f"SkillBank({len(self)} skills from {self.source})"

    @property
    def task_types(self) -> tuple[str, ...]:
        """Every task type some skill names, in first-seen order."""
        return tuple(dict.fromkeys(t for skill in self.skills for t in skill.task_types))

    @property
    def encoder(self) -> SentenceEncoder:
        if self._encoder is None:
            self._encoder = get_encoder()
        return self._encoder

    @property
    def embeddings(self) -> torch.Tensor:
        """(len(bank), dim) unit-norm embeddings of the skills' ``title: skill`` texts, computed once."""
        with self._lock:
            if self._embeddings is None:
                self._embeddings = self.encoder.encode([skill.text for skill in self.skills])
            return self._embeddings

    # ------------------------------------------------------------------------------------------- retrieval
    def scores_batch(self, task_texts: Sequence[str]) -> torch.Tensor:
        """Cosine similarities (len(task_texts), len(bank)) between the task queries and every skill."""
        task_texts = _as_text_list(task_texts, "task_texts")
        queries = self.encoder.encode([task_query(text) for text in task_texts])
        if not self.skills:
            return torch.zeros((len(task_texts), 0), dtype=torch.float32)
        return queries @ self.embeddings.T

    def retrieve_batch_with_scores(
        self,
        task_texts: Sequence[str],
        k: int = 2,
        task_types: Sequence[str | None] | str | None = None,
    ) -> list[list[tuple[Skill, float]]]:
        """Top-``k`` (skill, cosine) per task, best first; ``task_types`` is one per task, one for all, or None."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        task_texts = _as_text_list(task_texts, "task_texts")
        if task_types is None or isinstance(task_types, str):
            task_types = [task_types] * len(task_texts)
        task_types = list(task_types)
        if len(task_types) != len(task_texts):
            raise ValueError(f"got {len(task_types)} task_types for {len(task_texts)} task texts")
        if not task_texts:
            return []
        if k == 0 or not self.skills:
            return [[] for _ in task_texts]
        scores = self.scores_batch(task_texts).tolist()
        results = []
        for row, task_type in zip(scores, task_types):
            candidates = [
                (round(score, _TIE_DECIMALS), position)
                for position, score in enumerate(row)
                if self.skills[position].applies_to(task_type)
            ]
            candidates.sort(key=lambda item: (-item[0], item[1]))
            results.append([(self.skills[position], float(row[position])) for _, position in candidates[:k]])
        return results

    def retrieve_batch(
        self,
        task_texts: Sequence[str],
        k: int = 2,
        task_types: Sequence[str | None] | str | None = None,
    ) -> list[list[Skill]]:
        """Top-``k`` skills for each task (all queries encoded in one call)."""
        return [[skill for skill, _ in row] for row in self.retrieve_batch_with_scores(task_texts, k, task_types)]

    def retrieve(self, task_text: str, k: int = 2, task_type: str | None = None) -> list[Skill]:
        """Top-``k`` skills for one task, best first, among those that apply to ``task_type`` (None = all)."""
        return self.retrieve_batch([task_text], k, [task_type])[0]

    # ------------------------------------------------------------------------------------------- rendering
    @staticmethod
    def render(skills: Sequence[Skill], header: bool = True) -> str:
        """See :func:`render_skills`."""
        return render_skills(skills, header=header)

    def skill_lookup(self, task: str, task_type: str | None = None) -> str:
        """The ``generic_skill`` PI hook: the top ``default_k`` skills as bullet lines (no header: the PI
        builder adds its own wrapper and budget); "" when no skill applies."""
        return render_skills(self.retrieve(task, self.default_k, task_type), header=False)

    def make_skill_lookup(self, k: int | None = None, header: bool = False) -> Callable[[str, str | None], str]:
        """A ``skill_lookup(task, task_type) -> str`` with a chosen ``k`` and rendering."""
        top_k = self.default_k if k is None else k

        def skill_lookup(task: str, task_type: str | None = None) -> str:
            return render_skills(self.retrieve(task, top_k, task_type), header=header)

        return skill_lookup

    def render_batch(
        self,
        task_texts: Sequence[str],
        k: int | None = None,
        task_types: Sequence[str | None] | None = None,
        header: bool = True,
    ) -> list[str]:
        """The rendered skill block of each task (batched retrieval)."""
        rows = self.retrieve_batch(task_texts, self.default_k if k is None else k, task_types)
        return [render_skills(row, header=header) for row in rows]


def add_skill_guidance(specs: list[dict[str, Any]], bank: SkillBank, top_k: int) -> None:
    """Skill-GRPO: put each task's top-k skills, rendered with their header, in its spec's ``guidance``, which the
    policy prompt shows (training's ``prompt_skill_bank`` and ``taspo-eval --prompt_skill_bank``). A task that no
    skill applies to gets no ``guidance`` key."""
    skills = bank.retrieve_batch([str(s.get("task", "")) for s in specs], top_k, [s.get("task_type") for s in specs])
    for spec, chosen in zip(specs, skills, strict=True):
        if chosen:
            spec["guidance"] = bank.render(chosen)


def _as_text_list(texts: Sequence[str], name: str) -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, not a single string")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] is {type(text).__name__}, not str")
    return texts


def load_skill_bank(path_or_name: str | os.PathLike, **kwargs: Any) -> SkillBank:
    """Shorthand for :meth:`SkillBank.load`."""
    return SkillBank.load(path_or_name, **kwargs)


__all__ = [
    "SHIPPED_BANKS",
    "SKILLS_FOOTER",
    "SKILLS_HEADER",
    "Skill",
    "SkillBank",
    "SkillBankError",
    "add_skill_guidance",
    "load_skill_bank",
    "parse_skills",
    "render_skills",
    "shipped_bank_path",
    "task_query",
]
