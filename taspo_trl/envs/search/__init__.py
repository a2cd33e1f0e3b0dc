"""Search-QA (the Search-R1 protocol): ``<search>`` and ``<answer>`` actions over a retriever, exact-match reward.

Retrievers: the embedded ``bm25s`` index over a generated fictional encyclopedia (offline, the default) or any
Search-R1-style retrieval server over HTTP (``taspo-search-server`` serves the embedded index that way; see
docs/search-qa.md for Search-R1's e5 + wiki-18 server). Task sets: the embedded single-/multi-hop questions
and loaders for Search-R1's NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue and Bamboogle files.
"""

from .data import (
    EMBEDDED_DATASETS,
    SEARCH_R1_DATASETS,
    load_embedded_questions,
    load_questions,
    load_search_r1_questions,
    search_rows_from_settings,
    search_task_rows,
)
from .env import (
    SearchQAEnv,
    parse_search_action,
    search_env_factory,
)
from .oracle import oracle_actions, play_oracle
from .retrieval import (
    BM25Retriever,
    Document,
    HttpRetriever,
    RetrievalError,
    Retriever,
    get_retriever,
)
from .scoring import exact_match, normalize_answer

__all__ = [
    "EMBEDDED_DATASETS",
    "SEARCH_R1_DATASETS",
    "BM25Retriever",
    "Document",
    "HttpRetriever",
    "RetrievalError",
    "Retriever",
    "SearchQAEnv",
    "exact_match",
    "get_retriever",
    "load_embedded_questions",
    "load_questions",
    "load_search_r1_questions",
    "normalize_answer",
    "oracle_actions",
    "parse_search_action",
    "play_oracle",
    "search_env_factory",
    "search_rows_from_settings",
    "search_task_rows",
]
