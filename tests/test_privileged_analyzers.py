"""Analyzer backends: the rule-based default on an ALFWorld-like group, the OpenAI-compatible client over real
HTTP against the replay server, and the local transformers backend."""

from __future__ import annotations

import json

import pytest
from analyzer_server import ReplayServer
from test_privileged_protocol import SOLVE, kitchen_group, make_trajectory

from taspo_trl.privileged.analyzers import (
    AnalyzerError,
    Command,
    OpenAICompatibleAnalyzer,
    RuleBasedAnalyzer,
    TransformersAnalyzer,
    parse_command,
)
from taspo_trl.privileged.protocol import (
    alignment_messages,
    alignment_payload,
    exclude_target_only,
    extraction_messages,
    extraction_payload,
    parse_json_object,
    validate_alignment,
    validate_extraction,
)

MESSAGES = [{"role": "user", "content": "hello"}]


def extract(group, max_items=12):
    successes = {i: t for i, t in enumerate(group) if t.won}
    text = RuleBasedAnalyzer().complete(extraction_messages(extraction_payload(successes, max_items=max_items)))
    return text, validate_extraction(parse_json_object(text), group, max_items)


def align(group, target_id, items):
    allowed = exclude_target_only(items, target_id)
    text = RuleBasedAnalyzer().complete(alignment_messages(alignment_payload(target_id, group[target_id], allowed)))
    # Every candidate, not only the first G composed into P_i: these tests judge what the analyzer aligns.
    return validate_alignment(
        parse_json_object(text), target_id, group[target_id], [i.id for i in allowed], max_statements=None
    )


# ----------------------------------------------------------------------------------------------- rule-based


@pytest.mark.parametrize(
    ("action", "command"),
    [
        ("go to countertop 1", Command("goto", "", "countertop 1")),
        ("take apple 1 from countertop 1", Command("take", "apple 1", "countertop 1")),
        ("move apple 1 to fridge 1", Command("put", "apple 1", "fridge 1")),
        ("put apple 1 in/on fridge 1", Command("put", "apple 1", "fridge 1")),
        ("open fridge 1", Command("open", "", "fridge 1")),
        ("close fridge 1", Command("close", "", "fridge 1")),
        ("heat egg 1 with microwave 1", Command("heat", "egg 1", "microwave 1")),
        ("cool pan 1 with fridge 1", Command("cool", "pan 1", "fridge 1")),
        ("Clean  Apple 1 with sinkbasin 1", Command("clean", "apple 1", "sinkbasin 1")),
        ("slice bread 1 with knife 1", Command("slice", "bread 1", "knife 1")),
        ("use desklamp 1", Command("use", "desklamp 1", "")),
        ("examine alarmclock 2", Command("examine", "alarmclock 2", "")),
        ("look", None),
        ("search[red shoes]", None),
    ],
)
def test_parse_command_reads_alfworld_command_forms(action, command):
    assert parse_command(action) == command


def test_rule_based_items_pass_validation_with_real_quotes():
    text, result = extract(kitchen_group())
    assert not result.rejections
    assert text.startswith("{") and json.loads(text)["items"]
    by_kind = {
        kind: [i for i in result.accepted if i.kind == kind] for kind in ("requirement", "precondition", "ordering")
    }
    assert all(by_kind.values())
    statements = [i.statement for i in result.accepted]
    assert any('Open the fridge before you put the apple in/on the fridge ("open fridge 1").' in s for s in statements)
    assert any('("clean apple 1 with sinkbasin 1", then "move apple 1 to fridge 1")' in s for s in statements)
    opened = next(i for i in result.accepted if "Open the fridge" in i.statement)
    assert opened.support == {0, 1, 2} and opened.kind == "precondition"
    assert {ref.post_observation_quote for ref in opened.evidence} >= {
        "You open the fridge 1.",
        "You move the apple 1 to the fridge 1.",
    }


def test_rule_based_extraction_is_ranked_capped_and_deterministic():
    text, result = extract(kitchen_group(), max_items=5)
    assert len(result.accepted) == 5 and all(item.support == {0, 1, 2} for item in result.accepted)
    assert extract(kitchen_group(), max_items=5)[0] == text


def test_rule_based_extraction_ignores_failed_commands_and_untasked_objects():
    noisy = [
        ("take apple 1 from countertop 2", "Nothing happens."),
        ("take mug 2 from countertop 2", "You pick up the mug 2 from the countertop 2."),
    ] + SOLVE
    group = [make_trajectory(noisy, won=True), make_trajectory(SOLVE, won=True)]
    statements = " ".join(item.statement for item in extract(group)[1].accepted)
    assert "countertop 2" not in statements and "mug" not in statements


def test_source_only_items_are_excluded_for_their_source():
    group = kitchen_group()
    items = extract(group)[1].accepted
    table_only = {i.id for i in items if i.support == {2}}
    assert table_only and all("diningtable" in i.statement for i in items if i.id in table_only)
    assert not table_only & {s for st in align(group, 2, items).accepted for s in st.evidence_ids}
    assert table_only <= {s for st in align(group, 0, items).accepted for s in st.evidence_ids}


def test_rule_based_alignment_keeps_only_target_applicable_items():
    group = kitchen_group()
    items = extract(group)[1].accepted
    never_found_apple = align(group, 3, items)
    assert never_found_apple.accepted == [] and not never_found_apple.rejections
    skipped_cleaning = align(group, 4, items)
    assert not skipped_cleaning.rejections
    assert any("clean" in s.statement for s in skipped_cleaning.accepted)
    target_actions = {turn.action for turn in group[4].turns}
    assert all(s.target_quote in target_actions for s in skipped_cleaning.accepted)


def test_rule_based_rejects_non_protocol_messages():
    with pytest.raises(AnalyzerError):
        RuleBasedAnalyzer().complete(MESSAGES)


# ----------------------------------------------------------------------------------------------- OpenAI-compatible


@pytest.fixture(scope="module")
def server():
    replay = ReplayServer()
    yield replay
    replay.close()


def client(server, **kwargs) -> OpenAICompatibleAnalyzer:
    return OpenAICompatibleAnalyzer(server.base_url, "replay-model", **{"timeout": 5, "max_retries": 0, **kwargs})


def test_openai_backend_returns_the_assistant_text(server):
    server.script([{"match": "hello", "responses": [{"content": 'Sure: ```json\n{"items": []}\n```'}]}])
    assert client(server).complete(MESSAGES) == 'Sure: ```json\n{"items": []}\n```'
    assert server.stats()["requests"] == 1


def test_disk_cache_answers_repeats_without_the_server(server, tmp_path):
    server.script([{"match": "hello", "responses": [{"content": "first"}, {"content": "second"}]}])
    analyzer = client(server, cache_dir=tmp_path)
    assert analyzer.complete(MESSAGES) == "first"
    assert client(server, cache_dir=tmp_path).complete(MESSAGES) == "first"  # a fresh process-like instance
    assert server.stats()["requests"] == 1
    assert client(server, cache_dir=tmp_path, temperature=0.7).complete(MESSAGES) == "second"
    assert server.stats()["requests"] == 2
    assert (analyzer.requests, analyzer.cache_hits) == (1, 0)


def test_http_500_is_retried_then_raises(server):
    server.script([{"match": "hello", "responses": [{"status": 500, "content": "overloaded"}]}])
    analyzer = client(server, max_retries=2)
    with pytest.raises(AnalyzerError, match="InternalServerError"):
        analyzer.complete(MESSAGES)
    assert server.stats()["requests"] == 3 and analyzer.failures == 1


def test_http_500_then_success_recovers(server):
    server.script([{"match": "hello", "responses": [{"status": 500, "content": "busy"}, {"content": "ok"}]}])
    assert client(server, max_retries=2).complete(MESSAGES) == "ok"


def test_slow_answer_times_out(server):
    server.script([{"match": "hello", "responses": [{"content": "late", "delay": 2.0}]}])
    with pytest.raises(AnalyzerError, match="Timeout"):
        client(server, timeout=0.3).complete(MESSAGES)


def test_empty_answer_raises(server):
    server.script([{"match": "hello", "responses": [{"content": ""}]}])
    with pytest.raises(AnalyzerError, match="empty"):
        client(server).complete(MESSAGES)


def test_unreachable_server_raises():
    analyzer = OpenAICompatibleAnalyzer("http://127.0.0.1:9/v1", "m", timeout=1, max_retries=0)
    with pytest.raises(AnalyzerError, match="Connection"):
        analyzer.complete(MESSAGES)


# ----------------------------------------------------------------------------------------------- local transformers


def test_transformers_backend_decodes_greedily(tiny_model_dir):
    analyzer = TransformersAnalyzer(tiny_model_dir, max_new_tokens=6)
    first = analyzer.complete([{"role": "user", "content": "List the items as JSON."}])
    assert isinstance(first, str)
    assert analyzer.complete([{"role": "user", "content": "List the items as JSON."}]) == first


def test_transformers_backend_reports_an_overlong_prompt(tiny_model_dir):
    analyzer = TransformersAnalyzer(tiny_model_dir, max_new_tokens=4)
    with pytest.raises(AnalyzerError, match="exceeds"):
        analyzer.complete([{"role": "user", "content": "apple " * 5000}])
