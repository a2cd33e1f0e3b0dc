"""Search-QA environment: oracle and random policies on the embedded set, malformed actions, exact match,
task rows and the loaders of the official Search-R1 / FlashRAG files."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taspo_trl.envs import get_env_factory
from taspo_trl.envs.base import AgentEnv, task_spec_from_row
from taspo_trl.envs.search import (
    BM25Retriever,
    Document,
    SearchQAEnv,
    exact_match,
    load_embedded_questions,
    load_search_r1_questions,
    normalize_answer,
    oracle_actions,
    parse_search_action,
    play_oracle,
    search_env_factory,
    search_task_rows,
)
from taspo_trl.envs.search.data import embedded_data_dir
from taspo_trl.envs.search.env import MAX_QUERY_CHARS
from taspo_trl.envs.search.generator import write_embedded_data


@pytest.fixture(scope="module")
def test_specs() -> list[dict]:
    return [task_spec_from_row(row) for row in search_task_rows(split="test")]


def _env(spec: dict) -> SearchQAEnv:
    env = search_env_factory(spec)
    env.reset()
    return env


def test_registry_and_protocol(test_specs):
    env = get_env_factory("search")(test_specs[0])
    assert isinstance(env, AgentEnv)
    assert env.env_name == "search" and env.action_tags == ("search", "answer") and env.action_tag == "answer"
    assert env.max_turns == 4 and env.admissible_commands is None
    assert env.task_type in ("embedded_single", "embedded_multi")
    assert "<search>" in env.instructions and "<information>" in env.instructions and "<answer>" in env.instructions
    assert env.reset() == "Nothing retrieved yet." and env.task.endswith("?")


def test_oracle_solves_the_embedded_test_split(test_specs):
    wins = sum(play_oracle(_env(spec), spec).info["won"] for spec in test_specs)
    rate = wins / len(test_specs)
    print(f"oracle EM on {len(test_specs)} embedded test questions: {rate:.3f}")
    assert rate >= 0.95
    assert {s["task_type"] for s in test_specs} == {"embedded_single", "embedded_multi"}


def test_oracle_actions_are_one_search_per_hop_then_the_answer(test_specs):
    for spec in test_specs[:40]:
        actions = oracle_actions(spec)
        hops = 1 if spec["task_type"] == "embedded_single" else 2
        assert len(actions) == hops + 1 and all(a.startswith("<search>") for a in actions[:-1])
        env = _env(spec)
        results = [env.step(a) for a in actions]
        assert results[-1].done and results[-1].reward == 1.0 and results[-1].info["score"] == 1.0
        assert all(not r.done for r in results[:-1])
        assert all(r.observation.startswith("<information>Doc 1(Title: ") for r in results[:-1])


def test_random_policy_scores_low(test_specs):
    rng = random.Random(0)
    vocabulary = sorted({w for q in load_embedded_questions("train") for w in re.findall(r"[A-Za-z]+", q["question"] + " " + " ".join(q["golden_answers"]))})
    total = 0.0
    for spec in test_specs:
        env = _env(spec)
        result = None
        for _ in range(env.max_turns):
            words = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 3)))
            result = env.step(f"<search>{words}</search>" if rng.random() < 0.6 else f"<answer>{words}</answer>")
            if result.done:
                break
        total += result.reward
    rate = total / len(test_specs)
    print(f"random policy EM: {rate:.3f}")
    assert rate <= 0.05


MALFORMED = [
    "",
    "I think the answer is Paris",
    "<search></search>",
    "<search>   </search>",
    "<answer></answer>",
    "<search>unclosed",
    "<search>" + "long query words " * 200 + "</search>",
    "<search>Zürich 東京 😀 \x00\x07 café</search>",
    "<answer>東京</answer>",
    None,
]


@pytest.mark.parametrize("action", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_actions_get_a_normal_observation(action, test_specs):
    env = _env(test_specs[0])
    result = env.step(action)
    assert isinstance(result.observation, str) and result.observation
    assert set(result.info) >= {"won", "score", "truncated", "turn"} and result.info["turn"] == 1
    if result.done:  # only an answer ends an episode after one step
        assert action == "<answer>東京</answer>" and result.reward == 0.0
    elif not result.observation.lstrip("(").startswith(("<information>", "Your query")):
        assert "Invalid action" in result.observation and "<search>" in result.observation and "<answer>" in result.observation


def test_long_query_is_cut():
    env = SearchQAEnv("q?", ["a"], _RecordingRetriever())
    result = env.step("<search>" + "word " * 300 + "</search>")
    assert env.retriever.calls[0][0][0] and len(env.retriever.calls[0][0][0]) <= MAX_QUERY_CHARS
    assert "cut to its first" in result.observation


def test_answer_with_extra_whitespace_and_punctuation_wins(test_specs):
    spec = test_specs[0]
    result = _env(spec).step(f"<answer>  \n The {spec['golden_answers'][0].upper()} !!.  </answer>")
    assert result.done and result.reward == 1.0 and result.info["won"] is True


def test_raw_text_with_a_block_is_understood(test_specs):
    spec = test_specs[0]
    env = _env(spec)
    result = env.step(f"<think>easy</think> So: <answer>{spec['golden_answers'][0]}</answer> and more text")
    assert result.reward == 1.0


def test_max_turns_truncates_without_an_answer(test_specs):
    env = _env(test_specs[0])
    results = [env.step("<search>capital</search>") for _ in range(4)]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].info["truncated"] and results[-1].reward == 0.0 and results[-1].info["turn"] == 4
    again = env.step("<answer>x</answer>")  # stepping a finished episode changes nothing
    assert again.done and again.reward == 0.0 and again.info["turn"] == 4


def test_wrong_answer_ends_the_episode(test_specs):
    result = _env(test_specs[0]).step("<answer>certainly not this</answer>")
    assert result.done and result.reward == 0.0 and not result.info["truncated"] and result.info["won"] is False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=400))
def test_any_text_never_raises(text):
    env = SearchQAEnv("Who?", ["Nobody"], _RecordingRetriever())
    for wrapped in (text, f"<search>{text}</search>", f"<answer>{text}</answer>"):
        result = env.step(wrapped)
        assert isinstance(result.observation, str)


@pytest.mark.parametrize(
    ("prediction", "golds", "expected"),
    [
        ("Paris", ["paris"], 1.0),
        ("  the Paris. ", ["Paris"], 1.0),
        ("An apple", ["apple"], 1.0),
        ("The  United   States!", ["united states"], 1.0),
        ("Theodore", ["odore"], 0.0),  # "the" is removed only as a whole word
        ("U.S.A.", ["USA"], 1.0),
        ("Paris, France", ["Paris"], 0.0),
        ("1984", ["1,984", "1984"], 1.0),
        ("the", ["the"], 0.0),  # nothing left to match
        ("", ["x"], 0.0),
        ("Rock 'n' roll", ["rock n roll"], 1.0),
    ],
)
def test_exact_match(prediction, golds, expected):
    assert exact_match(prediction, golds) == expected


def test_normalize_answer():
    assert normalize_answer("  The Quick, brown FOX!  ") == "quick brown fox"
    assert normalize_answer("a an the") == ""


def test_parse_search_action():
    assert parse_search_action("<search> who founded X </search>") == ("search", "who founded X")
    assert parse_search_action("<ANSWER>Paris</ANSWER>") == ("answer", "Paris")
    assert parse_search_action("<search>a</answer>")[0] == "invalid"
    assert parse_search_action("x <answer>b</answer> <search>c</search>") == ("answer", "b")


class _RecordingRetriever:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        self.calls.append((list(queries), topk))
        return [[Document("T", f"about {q}", 1.0)] for q in queries]


def test_step_many_makes_one_retrieve_call_per_turn():
    retriever = _RecordingRetriever()
    envs = [SearchQAEnv(f"q{i}?", ["yes"], retriever) for i in range(6)]
    actions = ["<search>one</search>", "<answer>Yes.</answer>", "", "<search>two</search>", "<search>three</search>", "<search></search>"]
    results = SearchQAEnv.step_many(envs, actions)
    assert retriever.calls == [(["one", "two", "three"], 3)]
    assert results[0].observation == "<information>Doc 1(Title: T) about one</information>"
    assert results[1].reward == 1.0 and results[1].done
    assert "Invalid action" in results[2].observation and "Invalid action" in results[5].observation
    assert results[4].observation.endswith("about three</information>")


def test_failing_retriever_becomes_an_observation():
    class Broken:
        def retrieve(self, queries, topk):
            raise ConnectionError("boom")

    env = SearchQAEnv("q?", ["yes"], Broken())
    result = env.step("<search>x</search>")
    assert result.observation.startswith("<information>retrieval failed: ConnectionError: boom")
    assert not result.done and result.info["retrieval_error"]
    assert env.step("<answer>yes</answer>").reward == 1.0


def test_factory_validates_the_spec():
    with pytest.raises(ValueError, match="question"):
        search_env_factory({"golden_answers": ["a"]})
    with pytest.raises(ValueError, match="golden_answers"):
        search_env_factory({"question": "q?"})
    with pytest.raises(ValueError, match="golden_answers"):
        search_env_factory({"question": "q?", "golden_answers": []})
    with pytest.raises(ValueError, match="Unknown retriever"):
        search_env_factory({"question": "q?", "golden_answers": ["a"], "retriever": "bing"})
    env = search_env_factory({"task": "q?", "golden_answers": "a", "data_source": "nq", "topk": 5, "max_turns": 2})
    assert env.task_type == "nq" and env.topk == 5 and env.max_turns == 2 and env.golden_answers == ["a"]


def test_task_rows():
    rows = search_task_rows(split="train", datasets=["embedded_multi"], max_tasks=10, topk=5, max_turns=3)
    assert len(rows) == 10 and {r["task_type"] for r in rows} == {"embedded_multi"}
    spec = task_spec_from_row(rows[0])
    assert spec["env"] == "search" and spec["task"] == spec["question"] and spec["topk"] == 5 and spec["max_turns"] == 3
    assert rows == search_task_rows(split="train", datasets=["multi"], max_tasks=10, topk=5, max_turns=3)
    assert len(search_task_rows(split="train")) == 676 and len(search_task_rows(split="test")) == 224
    with pytest.raises(ValueError, match="embedded set"):
        search_task_rows(datasets=["nq"])


def test_shipped_data_is_reproduced_by_the_generator(tmp_path):
    write_embedded_data(tmp_path, seed=0)
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / name).read_bytes() == (embedded_data_dir() / name).read_bytes(), name
    train = {q["question"] for q in load_embedded_questions("train")}
    assert not train & {q["question"] for q in load_embedded_questions("test")}


def test_bm25_index_is_cached_atomically(tmp_path):
    first = BM25Retriever(cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [first.index_dir.name]  # no staging directory left
    stamp = (first.index_dir / "params.index.json").stat().st_mtime_ns
    second = BM25Retriever(cache_dir=tmp_path)
    assert (second.index_dir / "params.index.json").stat().st_mtime_ns == stamp
    assert second.retrieve(["zzzqqq", ""], 3) == [[], []]


# --- official Search-R1 / FlashRAG files -------------------------------------------------------------------------


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_flashrag_layout(tmp_path):
    _write_jsonl(tmp_path / "nq" / "test.jsonl", [{"id": "test_0", "question": "who wrote x", "golden_answers": ["A", "B"]}])
    _write_jsonl(tmp_path / "bamboogle" / "test.jsonl", [{"id": "b0", "question": "who?", "golden_answers": ["C"]}])
    questions = load_search_r1_questions(tmp_path, "test")
    assert [(q["data_source"], q["golden_answers"]) for q in questions] == [("bamboogle", ["C"]), ("nq", ["A", "B"])]
    rows = search_task_rows(str(tmp_path), split="test", datasets=["nq"], retriever="http://127.0.0.1:8000")
    spec = task_spec_from_row(rows[0])
    assert spec["task_type"] == "nq" and spec["retriever"] == "http://127.0.0.1:8000"
    with pytest.raises(FileNotFoundError, match=r"hotpotqa.*train\.jsonl.*expected"):
        load_search_r1_questions(tmp_path, "train", ["hotpotqa"])


def test_search_r1_parquet_layout(tmp_path):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        [
            {"id": "1", "question": "q1?", "golden_answers": ["x"], "data_source": "nq", "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}}},
            {"id": "2", "question": "q2?", "golden_answers": ["y", "z"], "data_source": "hotpotqa", "reward_model": {"style": "rule", "ground_truth": {"target": ["y", "z"]}}},
        ]
    )
    frame.to_parquet(tmp_path / "train.parquet")
    questions = load_search_r1_questions(tmp_path, "train", ["hotpotqa"])
    assert questions == [{"id": "2", "question": "q2?", "golden_answers": ["y", "z"], "data_source": "hotpotqa"}]
    frame.drop(columns=["golden_answers"]).to_parquet(tmp_path / "test.parquet")  # answers only in reward_model
    assert load_search_r1_questions(tmp_path / "test.parquet")[1]["golden_answers"] == ["y", "z"]


def test_malformed_files_name_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected either"):
        load_search_r1_questions(tmp_path / "nowhere")
    _write_jsonl(tmp_path / "nq" / "train.jsonl", [{"query": "no question column"}])
    with pytest.raises(ValueError, match="question.*golden_answers"):
        load_search_r1_questions(tmp_path, "train")
    (tmp_path / "musique").mkdir()
    (tmp_path / "musique" / "train.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_search_r1_questions(tmp_path, "train", ["musique"])
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="parquet"):
        load_search_r1_questions(tmp_path / "bad.parquet")


class _OracleGenerator:
    """Answers each prompt with the oracle's next action for the question it shows (one turn per call)."""

    def __init__(self, tokenizer, specs):
        self.tokenizer = tokenizer
        self.plans = {s["question"]: oracle_actions(s) for s in specs}
        self.calls = 0

    def __call__(self, prompts):
        from taspo_trl.rollout.generation import Generation

        out = []
        for ids in prompts:
            prompt = self.tokenizer.decode(ids)
            plan = next(plan for question, plan in self.plans.items() if question in prompt)
            text = f"<think>next step</think> {plan[min(self.calls, len(plan) - 1)]}"
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Generation(tokens, [-1.0] * len(tokens), True))
        self.calls += 1
        return out


def test_agent_loop_plays_search_episodes_end_to_end(embedded_tokenizer, test_specs):
    from taspo_trl.rollout.chat import ChatFormat
    from taspo_trl.rollout.env_pool import EnvPool
    from taspo_trl.rollout.loop import run_agent_loop

    specs = test_specs[:3] + test_specs[-3:]  # single-hop and multi-hop
    pool = EnvPool(get_env_factory("search"))
    try:
        trajectories = run_agent_loop(specs, pool, _OracleGenerator(embedded_tokenizer, specs), ChatFormat(embedded_tokenizer))
    finally:
        pool.shutdown()
    assert [t.won for t in trajectories] == [True] * 6 and [t.reward for t in trajectories] == [1.0] * 6
    assert [t.num_turns for t in trajectories] == [2, 2, 2, 3, 3, 3]
    first = trajectories[-1].turns[0]
    assert first.action_valid and first.observation.startswith("<information>Doc 1(Title: ")
    assert "<information>" in first.prompt_text and "<search>" in first.prompt_text
    assert {t.task_type for t in trajectories} == {"embedded_single", "embedded_multi"} and trajectories[0].env_name == "search"
