"""Retrieval throughput of the embedded bm25s index (and, optionally, of a retrieval server over HTTP).

Sends the embedded questions' hop queries and the questions themselves, ``--queries`` in all, in batches of
``--batch`` (one ``retrieve`` call per batch, as ``SearchQAEnv.step_many`` does per turn), and prints the time
for all of them and queries/s, after one warm-up batch (index load excluded):

    python benchmarks/retrieval_throughput.py --queries 1000 --batch 1000
    python benchmarks/retrieval_throughput.py --url http://127.0.0.1:8000 --batch 64   # a running server
"""

from __future__ import annotations

import argparse
import time

from taspo_trl.envs.search import get_retriever, load_embedded_questions


def _queries(n: int) -> list[str]:
    pool = []
    for row in load_embedded_questions("train") + load_embedded_questions("test"):
        pool.append(row["question"])
        pool += [hop["search"] for hop in row["hops"]]
    return [pool[i % len(pool)] for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1000, help="queries per retrieve call")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--url", default=None, help="benchmark this retrieval server instead of the embedded index")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best is reported")
    args = parser.parse_args(argv)
    retriever = get_retriever(args.url or "embedded", timeout=60)
    queries = _queries(args.queries)
    retriever.retrieve(queries[: args.batch], args.topk)
    best = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        found = 0
        for start in range(0, len(queries), args.batch):
            found += sum(bool(docs) for docs in retriever.retrieve(queries[start : start + args.batch], args.topk))
        best = min(best, time.perf_counter() - started)
    name = args.url or "embedded bm25s"
    print(f"{name}: {len(queries)} queries (batch {args.batch}, top-{args.topk}) in {best:.3f} s, "
          f"{len(queries) / best:,.0f} queries/s; {found}/{len(queries)} queries found documents")


if __name__ == "__main__":
    main()
