"""Analyzer backends: the rule-based default on an ALFWorld-like group and on real WebShop and Search-QA
episodes, the OpenAI-compatible client over real HTTP against the replay server, and the local transformers
backend."""

from __future__ import annotations

import json

import pytest

from taspo_trl.envs.alfworld.analysis import Command, parse_command
from taspo_trl.privileged.analyzers import (
    AnalyzerError,
    OpenAICompatibleAnalyzer,
    RuleBasedAnalyzer,
    TransformersAnalyzer,
    reasoning_request_fields,
)
from taspo_trl.privileged.builder import build_group_pi
from taspo_trl.privileged.context import make_analyzer
from taspo_trl.privileged.protocol import (
    PI_HEADER,
    alignment_messages,
    alignment_payload,
    exclude_target_only,
    extraction_messages,
    extraction_payload,
    parse_json_object,
    step_skill_messages,
    step_skill_payload,
    validate_alignment,
    validate_extraction,
    validate_step_skills,
)
from taspo_trl.trainers.taspo import TASPOConfig
from tests.helpers.analyzer_server import ReplayServer
from tests.helpers.cpu_config import cpu_trainer_kwargs
from tests.helpers.kitchen import SOLVE, kitchen_group, make_trajectory, played

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


def step_skills(group, target_id, items, max_step_skills=5):
    allowed = exclude_target_only(items, target_id)
    payload = step_skill_payload(target_id, group[target_id], allowed, max_step_skills=max_step_skills)
    text = RuleBasedAnalyzer().complete(step_skill_messages(payload))
    ids = [i.id for i in allowed]
    return text, validate_step_skills(parse_json_object(text), target_id, group[target_id], ids, max_step_skills)


def test_rule_based_step_skills_are_applicable_items_tied_to_the_targets_steps():
    """OPID's step skills from the rule-based analyzer: items that apply to the target, each at the target's step
    that takes one of the item's source actions (the precondition "go to fridge 1" at the target's own "go to
    fridge 1", not at the later put)."""
    group = kitchen_group()
    items = extract(group)[1].accepted
    text, result = step_skills(group, 4, items)
    assert not result.rejections
    by_step = {s.step: s.skill for s in result.accepted}
    assert sorted(by_step) == [0, 1, 2, 3, 4]  # five skills, one at each of its five steps
    assert by_step[2].startswith("Go to the fridge before you put the apple") and "go to fridge 1" in by_step[2]
    assert by_step[3].startswith("Open the fridge before you put the apple")
    assert by_step[0].startswith("Go to the countertop before you take the apple")
    assert "take apple 1 from countertop 1" in by_step[1] and "move apple 1 to fridge 1" in by_step[4]
    applicable = {s.statement for s in align(group, 4, items).accepted}
    assert set(by_step.values()) <= applicable
    capped = step_skills(group, 4, items, max_step_skills=2)[1]
    assert [s.step for s in capped.accepted] == [s.step for s in result.accepted][:2]
    assert step_skills(group, 4, items)[0] == text
    assert step_skills(group, 3, items)[1].accepted == []  # never found the apple: nothing applies


def test_rule_based_rejects_non_protocol_messages():
    with pytest.raises(AnalyzerError):
        RuleBasedAnalyzer().complete(MESSAGES)


def statements_by_target(group, items) -> list[list[str]]:
    return [[s.statement for s in align(group, k, items).accepted] for k in range(len(group))]


# ----------------------------------------------------------------------------------------------- rule-based: WebShop


@pytest.fixture(scope="module")
def webshop_group():
    """Four siblings of one embedded WebShop goal: the oracle's purchase; a purchase that first picks the wrong
    size and looks at the features page; a purchase of the right product without its options; a purchase of
    another product found with unrelated words."""
    from taspo_trl.envs.webshop import load_catalog, webshop_env_factory

    catalog = load_catalog(0)
    goal = catalog.goal("train", 0)
    asin, options = goal["asin"].lower(), list(goal["goal_options"].values())
    product = catalog.by_asin[goal["asin"]]
    wrong_size = next(v for v in product["options"]["size"] if v not in options)
    search = f"search[{goal['query']} {' '.join(goal['attributes'])}]"
    oracle = [search, f"click[{asin}]", *[f"click[{v}]" for v in options], "click[buy now]"]
    detour = [search, f"click[{asin}]", f"click[{wrong_size}]", "click[features]", "click[< prev]",
              *[f"click[{v}]" for v in options], "click[buy now]"]
    no_options = [search, f"click[{asin}]", "click[buy now]"]
    env = webshop_env_factory({"goal_index": 0, "split": "train"})
    env.reset()
    env.step("search[wool socks]")
    listed = [c for c in env.admissible_commands if c[len("click["):-1].upper() in env._page().split(" [SEP] ")]
    other = next(c for c in listed if c != f"click[{asin}]")
    elsewhere = ["search[wool socks]", other, "click[buy now]"]
    group = [played(webshop_env_factory({"goal_index": 0, "split": "train"}), plan)
             for plan in (oracle, detour, no_options, elsewhere)]
    return group, goal, product, wrong_size


def test_webshop_items_come_from_the_purchase_path(webshop_group):
    group, goal, product, wrong_size = webshop_group
    assert [t.won for t in group] == [True, True, False, False]
    text, result = extract(group)
    assert not result.rejections and result.accepted
    assert all(item.support == {0, 1} for item in result.accepted if item.kind != "ordering")
    statements = {item.kind: [i.statement for i in result.accepted if i.kind == item.kind] for item in result.accepted}
    requirements = " ".join(statements["requirement"])
    asin = goal["asin"]
    assert f"Buy {asin} ({product['Title']})" in requirements and f"click[{asin.lower()}]" in requirements
    for value in goal["goal_options"].values():
        assert f'select the option "{value}"' in requirements
    assert wrong_size not in " ".join(i.statement for i in result.accepted)  # replaced by a later size click
    assert f"search[{goal['query']}" in requirements
    assert any(f"only on the page of {asin}" in s for s in statements["precondition"])
    oracle_path = " -> ".join(f'"{turn.action}"' for turn in group[0].turns)
    assert f"The click path that bought it: {oracle_path}." in statements["ordering"]
    # the product is cited where it was listed: on the results page the click came from
    product_item = next(i for i in result.accepted if i.statement.startswith(f"Buy {asin}"))
    assert {ref.pre_observation_quote for ref in product_item.evidence} == {asin}
    assert extract(group)[0] == text  # deterministic


def test_webshop_alignment_needs_the_target_to_have_seen_the_product(webshop_group):
    group, goal, _, _ = webshop_group
    items = extract(group)[1].accepted
    targets = statements_by_target(group, items)
    asin = goal["asin"]
    # the sibling that bought the right product without its options is told which options to pick
    assert any(s.startswith(f"Buy {asin}") for s in targets[2])
    assert all(any(f'"{v}"' in s for s in targets[2]) for v in goal["goal_options"].values())
    # the sibling that never saw the product gets nothing about it: the search, quoting its own, and the options
    # its instruction names
    assert all(asin not in s for s in targets[3])
    quotes = {s.statement.split(" (")[0]: s.target_quote for s in align(group, 3, items).accepted}
    assert quotes.pop("Search with the instruction's words for the product, as the successful search did: "
                      f'"{group[0].turns[0].action}".') == group[3].turns[0].action
    options = goal["goal_options"].values()
    assert sorted(quotes) == sorted(f'On the product page, select the option "{v}"' for v in options)
    assert set(quotes.values()) == {goal["instruction_text"]}
    assert targets[0] and targets[1]  # each success is supported by the other one


# ----------------------------------------------------------------------------------------------- rule-based: Search-QA


@pytest.fixture(scope="module")
def search_group():
    """Four siblings of one embedded two-hop question: the oracle; the oracle after an unhelpful search; a
    sibling that answers with the bridge entity after the first hop; one that answers without searching."""
    from taspo_trl.envs.search import load_embedded_questions, oracle_actions, search_env_factory

    row = next(q for q in load_embedded_questions("train") if q["data_source"] == "embedded_multi")
    spec = {**row, "retriever": "embedded"}
    oracle = oracle_actions(spec)
    first, bridge = row["hops"][0], row["hops"][0]["reveals"]
    plans = [oracle, ["<search>river city</search>", *oracle], [oracle[0], f"<answer>{bridge}</answer>"],
             ["<answer>Paris</answer>"]]
    group = [played(search_env_factory(spec), plan) for plan in plans]
    return group, row, first


def test_search_items_follow_the_hops_to_the_document_holding_the_answer(search_group):
    group, row, first = search_group
    assert [t.won for t in group] == [True, True, False, False]
    text, result = extract(group)
    assert not result.rejections and result.accepted
    assert all(item.support == {0, 1} for item in result.accepted)
    statements = [item.statement for item in result.accepted]
    hop1, hop2 = (hop["search"] for hop in row["hops"])
    answer = row["golden_answers"][0]
    assert f'Search for "{hop1}" first: its results lead to the next search, "{hop2}"' in " ".join(statements)
    assert f'Search for "{hop2}": its results hold the answer' in " ".join(statements)
    assert any(s.startswith(f'Search for "{hop1}" before you search for "{hop2}"') for s in statements)
    assert "river city" not in " ".join(statements)  # the unhelpful search led nowhere
    fact = next(item for item in result.accepted if "So the answer is" in item.statement)
    # what was learned: the retrieved document (titled after the second hop) and its sentence naming the answer
    learned = fact.evidence[0].post_observation_quote
    assert answer in learned and learned in group[0].turns[1].observation and "Doc " not in learned
    assert f'retrieved "{hop2}", which says: "{learned}" So the answer is "{answer}"' in fact.statement
    assert first["reveals"] in next(i for i in result.accepted if i.statement.startswith(f'Search for "{hop1}" first')
                                    ).evidence[0].post_observation_quote
    assert extract(group)[0] == text  # deterministic


def test_search_guidance_applies_to_every_sibling_quoting_its_own_actions(search_group):
    group, row, _ = search_group
    items = extract(group)[1].accepted
    for k, target in enumerate(group):
        accepted = align(group, k, items).accepted
        assert len(accepted) == len(items)
        own = {turn.action for turn in target.turns} | {target.task}
        assert all(s.target_quote in own for s in accepted)
    fact = next(s for s in align(group, 3, items).accepted if "So the answer is" in s.statement)
    assert fact.target_quote == "<answer>Paris</answer>"


def test_pi_on_webshop_and_search_goes_through_the_builder(webshop_group, search_group, embedded_tokenizer):
    for group in (webshop_group[0], search_group[0]):
        first = build_group_pi(group, RuleBasedAnalyzer(), embedded_tokenizer)
        assert first.stats.coverage == 1.0 and not first.stats.rejections
        assert all(text.startswith(PI_HEADER) and len(embedded_tokenizer.encode(text)) <= 256 for text in first.texts)
        assert build_group_pi(group, RuleBasedAnalyzer(), embedded_tokenizer).texts == first.texts


def test_step_skills_on_webshop_and_search_go_through_the_builder(webshop_group, search_group, embedded_tokenizer):
    for group in (webshop_group[0], search_group[0]):
        result = build_group_pi(group, RuleBasedAnalyzer(), embedded_tokenizer, max_step_skills=5)
        assert result.stats.step_skills > 0 and not result.stats.rejections
        assert all(len(skills) <= 5 for skills in result.step_skills)


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


def _configured_body(server, tmp_path, **settings) -> dict:
    """The body the server received for one request of the analyzer a TASPOConfig with ``settings`` builds."""
    args = TASPOConfig(**cpu_trainer_kwargs(
        tmp_path, analyzer="openai", analyzer_base_url=server.base_url, analyzer_model="replay-model",
        analyzer_max_retries=0, analyzer_api_key_env="", **settings,  # a local server needs no key
    ))
    server.script([{"match": "hello", "responses": [{"content": "ok"}]}])
    assert make_analyzer(args, args.environment).complete(MESSAGES) == "ok"
    (body,) = server.bodies()
    assert (body["model"], body["messages"], body["temperature"]) == ("replay-model", MESSAGES, 0.0)
    return body


def test_analyzer_requests_carry_the_papers_reasoning_off_setting(server, tmp_path):
    """The paper's analyzer runs with reasoning disabled (C.3): the request the server receives says so, in the
    field the configured server reads; server_default sends no such field; extra fields join it."""
    default = _configured_body(server, tmp_path / "a")
    assert default["thinking"] == {"type": "disabled"} and "chat_template_kwargs" not in default
    templated = _configured_body(server, tmp_path / "b", analyzer_reasoning_param="chat_template_kwargs")
    assert templated["chat_template_kwargs"] == {"enable_thinking": False} and "thinking" not in templated
    assert _configured_body(server, tmp_path / "c", analyzer_reasoning="on")["thinking"] == {"type": "enabled"}
    bare = _configured_body(server, tmp_path / "d", analyzer_reasoning="server_default")
    assert not {"thinking", "chat_template_kwargs"} & set(bare)
    extra = _configured_body(server, tmp_path / "e", analyzer_extra_body='{"reasoning_effort": "minimal"}')
    assert (extra["reasoning_effort"], extra["thinking"]) == ("minimal", {"type": "disabled"})


def test_reasoning_setting_is_part_of_the_cache_key(server, tmp_path):
    server.script([{"match": "hello", "responses": [{"content": "without"}, {"content": "with"}]}])
    off = reasoning_request_fields("off", "thinking")
    assert client(server, cache_dir=tmp_path).complete(MESSAGES) == "without"
    assert client(server, cache_dir=tmp_path, extra_body=off).complete(MESSAGES) == "with"
    assert client(server, cache_dir=tmp_path, extra_body=off).complete(MESSAGES) == "with"
    assert server.stats()["requests"] == 2


def test_reasoning_settings_are_checked_when_the_config_is_built(tmp_path):
    # YAML reads a bare `analyzer_reasoning: off` as false.
    assert TASPOConfig(**cpu_trainer_kwargs(tmp_path, analyzer_reasoning=False)).analyzer_reasoning == "off"
    with pytest.raises(ValueError, match="analyzer_reasoning must be one of"):
        TASPOConfig(**cpu_trainer_kwargs(tmp_path, analyzer_reasoning="disabled"))
    with pytest.raises(ValueError, match="analyzer_reasoning_param must be one of"):
        TASPOConfig(**cpu_trainer_kwargs(tmp_path, analyzer_reasoning_param="reasoning"))
    with pytest.raises(ValueError, match="analyzer_extra_body must be a JSON object"):
        TASPOConfig(**cpu_trainer_kwargs(tmp_path, analyzer_extra_body="minimal"))


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


def test_transformers_backend_renders_reasoning_off_in_the_chat_template(tiny_model_dir):
    """A Qwen3-style template reads enable_thinking; the analyzer passes the configured mode to it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    def prompt(reasoning: str) -> str:
        analyzer = TransformersAnalyzer(model, tokenizer, max_new_tokens=1, reasoning=reasoning)
        return tokenizer.decode(analyzer.prompt_inputs(MESSAGES)["input_ids"][0])

    assert prompt("off") == "hello<think></think>"
    assert prompt("on") == prompt("server_default") == "hello"
    with pytest.raises(ValueError, match="reasoning must be one of"):
        TransformersAnalyzer(model, tokenizer, reasoning="none")


def test_the_openai_analyzer_without_the_openai_package_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "openai", None)  # what an environment without the package looks like
    args = TASPOConfig(**cpu_trainer_kwargs(
        tmp_path, analyzer="openai", analyzer_base_url="http://127.0.0.1:9/v1", analyzer_model="m",
        analyzer_api_key_env="",
    ))
    with pytest.raises(ImportError, match=r"pip install 'taspo-trl\[openai\]'.*analyzer: rule"):
        make_analyzer(args, args.environment)


def test_a_named_rule_set_reads_every_request_with_it():
    group = kitchen_group()
    successes = {i: t for i, t in enumerate(group) if t.won}
    messages = extraction_messages(extraction_payload(successes, max_items=12))
    by_syntax = RuleBasedAnalyzer().complete(messages)
    assert json.loads(by_syntax)["items"]  # the kitchen's ALFWorld commands give items
    assert RuleBasedAnalyzer("alfworld").complete(messages) == by_syntax
    # WebShop's rules look for a purchase path (search, product click, buy): an ALFWorld success has none
    assert json.loads(RuleBasedAnalyzer("webshop").complete(messages))["items"] == []


def test_an_environment_without_rules_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"'alfworld', 'webshop', 'search' only, not for environment 'lockers'"):
        RuleBasedAnalyzer("lockers")
    with pytest.raises(ValueError, match=r"analyzer_rules must be one of \('alfworld', 'webshop', 'search'\)"):
        TASPOConfig(**cpu_trainer_kwargs(tmp_path, analyzer_rules="kitchen"))


def test_rules_registered_for_an_environment_read_its_requests(monkeypatch):
    from taspo_trl import envs
    from taspo_trl.envs.alfworld.analysis import ALFWorldRules

    with pytest.raises(ValueError, match=r"not for environment 'lockers'.*envs\.register_analyzer_rules\(\)"):
        RuleBasedAnalyzer("lockers")
    with pytest.raises(ValueError, match=r"'lockers' has no rules.*register_analyzer_rules"):
        envs.get_analyzer_rules("lockers")
    monkeypatch.setattr(envs, "_ANALYZER_RULES", dict(envs._ANALYZER_RULES))  # the registration ends with the test
    envs.register_analyzer_rules("lockers", ALFWorldRules)
    group = kitchen_group()
    messages = extraction_messages(extraction_payload({i: t for i, t in enumerate(group) if t.won}, max_items=12))
    assert RuleBasedAnalyzer("lockers").complete(messages) == RuleBasedAnalyzer("alfworld").complete(messages)
