"""Search-QA task sets: the embedded fictional-encyclopedia questions and the official Search-R1 / FlashRAG files.

Every loader returns question dicts ``{"id", "question", "golden_answers", "data_source"}``; ``search_task_rows``
turns them into dataset rows whose ``prompt`` carries the whole task spec (``encode_task_prompt``).

Accepted layouts for the official sets under a local ``ROOT`` (``source`` = ``ROOT`` or one file):

- Search-R1's processed parquet (``scripts/data_process/qa_search_{train,test}_merge.py``, ``nq_search.py``):
  ``ROOT/{split}.parquet`` with columns ``question``, ``golden_answers`` (or ``reward_model.ground_truth.target``)
  and ``data_source``, all datasets in one file.
- FlashRAG's raw files (``RUC-NLPIR/FlashRAG_datasets``): ``ROOT/{dataset}/{split}.jsonl`` (or ``.parquet``)
  with ``question`` and ``golden_answers``; the dataset is the folder name. Not every set has every split
  (Bamboogle only has ``test``, several others use ``dev``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ...jsonl import read_json_objects
from ..base import encode_task_prompt
from .env import DEFAULT_MAX_TURNS, DEFAULT_TOPK
from .retrieval import EMBEDDED, check_retriever_spec

SINGLE_HOP = "embedded_single"
MULTI_HOP = "embedded_multi"
EMBEDDED_DATASETS = (SINGLE_HOP, MULTI_HOP)
SEARCH_R1_DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
_ALIASES = {"2wiki": "2wikimultihopqa", "trivia": "triviaqa", "trivia_qa": "triviaqa", "hotpot": "hotpotqa", "single": SINGLE_HOP, "multi": MULTI_HOP}
_LAYOUT_HINT = (
    "expected either Search-R1's processed file ROOT/{split}.parquet (columns question, golden_answers, "
    "data_source) or FlashRAG's ROOT/<dataset>/{split}.jsonl (fields question, golden_answers), with <dataset> "
    f"one of {', '.join(SEARCH_R1_DATASETS)}"
)


def canonical_dataset(name: str) -> str:
    """Lower-cased dataset name with common aliases resolved (``2wiki`` -> ``2wikimultihopqa``)."""
    name = name.strip().lower()
    return _ALIASES.get(name, name)


def embedded_data_dir() -> Path:
    return Path(str(resources.files("taspo_trl") / "data" / "search"))


@lru_cache(maxsize=4)
def _embedded_rows(split: str) -> tuple[dict[str, Any], ...]:
    path = embedded_data_dir() / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"Embedded Search-QA split {split!r} not found at {path}; splits are 'train' and 'test'.")
    with open(path, encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


def load_embedded_questions(split: str = "train") -> list[dict[str, Any]]:
    """The shipped fictional-encyclopedia questions of ``split`` (``train``: 676, ``test``: 224), each with the
    ``hops`` the oracle follows."""
    return [dict(row) for row in _embedded_rows(split)]


def _answers(row: Mapping[str, Any]) -> list[str]:
    answers = row.get("golden_answers")
    if answers is None:
        reward_model = row.get("reward_model")
        if isinstance(reward_model, Mapping):
            answers = (reward_model.get("ground_truth") or {}).get("target")
    if isinstance(answers, str):
        answers = [answers]
    return [str(a) for a in (answers if answers is not None else []) if str(a).strip()]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as error:  # pyarrow raises many exception types for a bad file
            raise ValueError(f"Cannot read the parquet file {path}: {error} ({_LAYOUT_HINT}).") from error
        return frame.to_dict("records")
    return read_json_objects(path, f"a JSON object per line ({_LAYOUT_HINT})")


def _questions_from_file(path: Path, default_source: str | None) -> list[dict[str, Any]]:
    questions = []
    for i, row in enumerate(_read_rows(path)):
        question, answers = row.get("question"), _answers(row)
        if not isinstance(question, str) or not question.strip() or not answers:
            raise ValueError(
                f"{path}, row {i}: needs a non-empty 'question' and 'golden_answers' (found columns "
                f"{sorted(row)}); {_LAYOUT_HINT}."
            )
        source = row.get("data_source") or default_source
        if not source:
            raise ValueError(f"{path}, row {i}: no 'data_source' column and no <dataset> folder to name it; {_LAYOUT_HINT}.")
        questions.append({"id": str(row.get("id", f"{path.stem}-{i}")), "question": question.strip(), "golden_answers": answers, "data_source": canonical_dataset(str(source))})
    return questions


def load_search_r1_questions(source: str | Path, split: str = "train", datasets: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Questions of the official sets from a local file or ``ROOT`` (layouts in the module docstring)."""
    root = Path(source).expanduser()
    wanted = [canonical_dataset(d) for d in datasets] if datasets else None
    if root.is_file():
        questions = _questions_from_file(root, root.parent.name if root.parent.name in SEARCH_R1_DATASETS else None)
    elif (root / f"{split}.parquet").is_file():
        questions = _questions_from_file(root / f"{split}.parquet", None)
    elif root.is_dir():
        names = wanted or sorted(p.name for p in root.iterdir() if p.is_dir() and p.name in SEARCH_R1_DATASETS)
        if not names:
            raise FileNotFoundError(f"No Search-QA data under {root}: {_LAYOUT_HINT}.")
        questions = []
        for name in names:
            candidates = [root / name / f"{split}.{ext}" for ext in ("jsonl", "parquet")]
            found = next((c for c in candidates if c.is_file()), None)
            if found is None:
                raise FileNotFoundError(f"Missing {candidates[0]} (or .parquet) for dataset {name!r}, split {split!r}: {_LAYOUT_HINT}.")
            questions += _questions_from_file(found, name)
    else:
        raise FileNotFoundError(f"Search-QA data path not found: {root}; {_LAYOUT_HINT}.")
    if wanted:
        questions = [q for q in questions if q["data_source"] in wanted]
        if not questions:
            raise ValueError(f"No questions of {wanted} in {root} (split {split!r}).")
    return questions


def load_questions(source: str = EMBEDDED, split: str = "train", datasets: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """``source="embedded"`` for the shipped set (``datasets`` may pick ``embedded_single``/``embedded_multi``),
    else a local path of the official sets."""
    if source != EMBEDDED:
        return load_search_r1_questions(source, split, datasets)
    questions = load_embedded_questions(split)
    if datasets:
        wanted = [canonical_dataset(d) for d in datasets]
        unknown = sorted(set(wanted) - set(EMBEDDED_DATASETS))
        if unknown:
            raise ValueError(f"The embedded set has datasets {list(EMBEDDED_DATASETS)}, not {unknown}.")
        questions = [q for q in questions if q["data_source"] in wanted]
    return questions


def search_rows_from_settings(settings: Mapping[str, Any], max_turns: int | None) -> list[dict[str, Any]]:
    """Search-QA's ``TaskRowBuilder``: ``search_task_rows`` of the settings' ``task_source``, ``task_split``,
    ``search_datasets``, ``max_tasks``, ``retriever`` and ``retrieval_topk``."""
    return search_task_rows(
        source=settings["task_source"],
        split=settings["task_split"],
        datasets=settings["search_datasets"],
        max_tasks=settings["max_tasks"],
        retriever=settings["retriever"],
        topk=settings["retrieval_topk"],
        max_turns=max_turns or DEFAULT_MAX_TURNS,
    )


def search_task_rows(
    source: str = EMBEDDED,
    split: str = "train",
    datasets: list[str] | None = None,
    max_tasks: int | None = None,
    retriever: str = EMBEDDED,
    topk: int = DEFAULT_TOPK,
    max_turns: int = DEFAULT_MAX_TURNS,
    seed: int = 0,
    timeout: float | None = None,
    retries: int | None = None,
) -> list[dict[str, Any]]:
    """Dataset rows ``{"prompt", "task_type"}``, ``prompt`` being the JSON task spec for ``search_env_factory``.

    ``max_tasks`` keeps a seeded random sample (file order is often grouped by dataset, so a plain head would
    drop whole datasets). ``timeout``/``retries`` go into the spec for an HTTP retriever (factory defaults
    otherwise)."""
    check_retriever_spec(retriever)  # a bad spec fails here, not in every episode
    questions = load_questions(source, split, datasets)
    if max_tasks is not None and max_tasks < len(questions):
        keep = sorted(random.Random(seed).sample(range(len(questions)), max_tasks))
        questions = [questions[i] for i in keep]
    rows = []
    for q in questions:
        spec = {
            "env": "search",
            "id": q["id"],
            "task": q["question"],
            "question": q["question"],
            "golden_answers": list(q["golden_answers"]),
            "task_type": q["data_source"],
            "retriever": retriever,
            "topk": topk,
            "max_turns": max_turns,
        }
        spec.update({k: v for k, v in (("timeout", timeout), ("retries", retries)) if v is not None})
        rows.append({"prompt": encode_task_prompt(spec), "task_type": q["data_source"]})
    return rows
