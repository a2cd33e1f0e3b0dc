"""The A.2 analyzer protocol: compaction, outcome-free target payloads, JSON extraction, validation, exclusion,
composition, on the hand-built ALFWorld-like group of ``tests.helpers.kitchen``."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taspo_trl.privileged import protocol as P
from taspo_trl.privileged.protocol import (
    PI_FOOTER,
    PI_HEADER,
    AnalyzerResponseError,
    EvidenceItem,
    EvidenceRef,
    alignment_payload,
    clip_middle,
    compact_trace,
    compose_pi,
    exclude_target_only,
    extraction_payload,
    parse_json_object,
    step_skill_messages,
    step_skill_payload,
    validate_alignment,
    validate_extraction,
    validate_step_skills,
)
from tests.helpers.kitchen import (
    CLEAN,
    INTRO,
    OPEN_FRIDGE,
    PUT,
    SOLVE,
    TAKE,
    TASK,
    kitchen_group,
    make_trajectory,
    make_turn,
)


def valid_item(item_id: str = "E1", trajectory_id: int = 0, **changes) -> dict:
    item = {
        "id": item_id,
        "kind": "precondition",
        "statement": "Open the fridge before putting the apple in it.",
        "evidence": [
            {
                "trajectory_id": trajectory_id,
                "step": 5,
                "action_quote": "open fridge 1",
                "pre_observation_quote": "The fridge 1 is closed.",
                "post_observation_quote": "In it, you see a egg 1",
            }
        ],
    }
    item.update(changes)
    return item


def _keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


# ----------------------------------------------------------------------------------------------- compaction


def test_compact_trace_keeps_every_step_with_pre_and_post_observations():
    trajectory = make_trajectory(SOLVE, won=True)
    trajectory.turns[0].observation = "You arrive at countertop 1.\n\n   On the countertop 1,\tyou see a apple 1."
    trace = compact_trace(trajectory)
    assert trace["task"] == TASK
    assert [s["step"] for s in trace["steps"]] == list(range(len(SOLVE)))
    assert trace["steps"][0]["pre_observation"] == " ".join(INTRO.split())
    assert (
        trace["steps"][0]["post_observation"] == "You arrive at countertop 1. On the countertop 1, you see a apple 1."
    )
    assert trace["steps"][1]["pre_observation"] == trace["steps"][0]["post_observation"]
    assert trace["steps"][6] == {
        "step": 6,
        "action": "move apple 1 to fridge 1",
        "pre_observation": OPEN_FRIDGE,
        "post_observation": PUT,
    }


def test_overlong_fields_keep_head_and_tail():
    long_observation = "You see " + ", ".join(f"a book {n}" for n in range(3000)) + ". The end."
    trajectory = make_trajectory([("look", long_observation), ("x" * 1000, "ok")], won=False, task="t" * 5000)
    trace = compact_trace(trajectory, char_budget=2000)
    assert len(trace["task"]) == P.TASK_CHAR_CAP
    assert len(trace["steps"][1]["action"]) == P.ACTION_CHAR_CAP
    clipped = trace["steps"][0]["post_observation"]
    assert clipped.startswith("You see a book 0, a book 1") and clipped.endswith("The end.") and " ... " in clipped
    total = len(trace["task"]) + sum(
        len(s["action"]) + len(s["pre_observation"]) + len(s["post_observation"]) for s in trace["steps"]
    )
    assert total <= 2000


@settings(max_examples=60, deadline=None)
@given(
    task=st.text(min_size=1, max_size=1600),
    steps=st.lists(st.tuples(st.text(max_size=400), st.text(max_size=3000)), min_size=1, max_size=12),
    intro=st.text(max_size=3000),
    budget=st.integers(min_value=200, max_value=20_000),
)
def test_compaction_stays_within_budget(task, steps, intro, budget):
    trace = compact_trace(make_trajectory(steps, won=False, task=task, intro=intro), char_budget=budget)
    observations = [s[key] for s in trace["steps"] for key in ("pre_observation", "post_observation")]
    total = len(trace["task"]) + sum(len(s["action"]) for s in trace["steps"]) + sum(map(len, observations))
    assert len(trace["task"]) <= P.TASK_CHAR_CAP
    assert all(len(s["action"]) <= P.ACTION_CHAR_CAP for s in trace["steps"])
    # Within C, unless the 40-character observation minimum alone overflows it (A.2: C is approximate).
    assert total <= budget or all(len(o) <= P.MIN_OBSERVATION_CHARS for o in observations)
    assert len(trace["steps"]) == len(steps)
    json.dumps(trace)


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=400), limit=st.integers(min_value=1, max_value=400))
def test_clip_middle_keeps_head_and_tail_within_limit(text, limit):
    clipped = clip_middle(text, limit)
    assert len(clipped) <= limit
    if len(text) <= limit:
        assert clipped == text
    elif limit >= 7:
        head, tail = clipped.split(P.ELLIPSIS, 1) if P.ELLIPSIS in clipped else (clipped, "")
        assert text.startswith(head) and text.endswith(tail) and abs(len(head) - len(tail)) <= 1


def test_target_payload_has_no_outcome_fields():
    group = kitchen_group()
    item = EvidenceItem(
        "E1", "requirement", "Clean the apple.", [EvidenceRef(0, 3, "clean apple 1", post_observation_quote=CLEAN)]
    )
    payload = alignment_payload(0, group[0], [item])
    assert group[0].won and group[0].reward == 1.0
    assert not _keys(payload) & P.OUTCOME_KEYS
    assert "episode_reward" not in json.dumps(payload) and "verified_success" not in json.dumps(payload)
    # The source payload, by contrast, is explicitly about verified successes.
    source = extraction_payload({0: group[0]})
    assert all(s["verified_success"] for s in source["successes"])


# ----------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text",
    [
        '{"items": []}',
        'Here you go:\n```json\n{"items": []}\n```\nDone.',
        '```\n{"items": []}\n```',
        'Sure! The analysis is {"items": []} -- hope it helps {not json}.',
    ],
)
def test_parse_json_object_finds_the_object(text):
    assert parse_json_object(text) == {"items": []}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2]", "response_not_object"),
        ('```json\n["a"]\n```', "response_not_object"),
        ('{"items": [', "no_json_object"),
        ("no json", "no_json_object"),
    ],
)
def test_parse_json_object_rejects(text, reason):
    with pytest.raises(AnalyzerResponseError) as error:
        parse_json_object(text)
    assert error.value.reason == reason


# ----------------------------------------------------------------------------------------------- validation


def test_valid_item_is_accepted_against_original_records():
    result = validate_extraction({"items": [valid_item()]}, kitchen_group())
    assert not result.rejections
    assert result.accepted[0].support == {0}
    assert result.accepted[0].evidence[0].action_quote == "open fridge 1"


@pytest.mark.parametrize(
    ("items", "reason"),
    [
        ([valid_item("E1"), valid_item("E1", statement="Open it first.")], "duplicate_id"),
        ([valid_item("")], "missing_id"),
        ([valid_item(statement="x" * 801)], "statement_too_long"),
        ([valid_item(statement="   ")], "empty_statement"),
        ([valid_item(kind="hint")], "unknown_kind"),
        ([valid_item(evidence=[])], "missing_evidence"),
        ([valid_item(trajectory_id=3)], "reference_not_success"),
        ([valid_item(trajectory_id=9)], "unknown_trajectory"),
        ([valid_item(evidence=[dict(valid_item()["evidence"][0], step=40)])], "invalid_step"),
        (
            [valid_item(evidence=[dict(valid_item()["evidence"][0], action_quote="open microwave 1")])],
            "action_quote_mismatch",
        ),
        (
            [valid_item(evidence=[dict(valid_item()["evidence"][0], post_observation_quote="you see a golden key")])],
            "observation_quote_mismatch",
        ),
        (
            [
                valid_item(
                    evidence=[dict(valid_item()["evidence"][0], pre_observation_quote="", post_observation_quote="")]
                )
            ],
            "missing_observation_quote",
        ),
        (["not an object"], "item_not_object"),
    ],
)
def test_validation_rejects_bad_items(items, reason):
    result = validate_extraction({"items": items}, kitchen_group())
    assert result.accepted == []
    assert result.rejections[reason] == len(items)


def test_validation_needs_an_items_list():
    assert validate_extraction({"answer": "open the fridge"}, kitchen_group()).rejections == {"missing_items": 1}


def test_invalid_actions_cannot_be_cited():
    group = kitchen_group()
    group[0].turns[5] = make_turn("open fridge 1", OPEN_FRIDGE, valid=False)
    assert validate_extraction({"items": [valid_item()]}, group).rejections == {"invalid_action": 1}


def test_quotes_are_checked_against_original_records_not_compacted_ones():
    group = kitchen_group()
    hidden = "a very rare silver spoon 7"
    group[0].turns[5].observation = (
        OPEN_FRIDGE + " " + ("filler words here. " * 400) + hidden + " " + ("more filler. " * 400)
    )
    compacted = compact_trace(group[0], char_budget=2000)["steps"][5]["post_observation"]
    assert hidden not in compacted and " ... " in compacted
    elided = valid_item(evidence=[dict(valid_item()["evidence"][0], post_observation_quote=hidden)])
    across_gap = valid_item(
        "E2", evidence=[dict(valid_item()["evidence"][0], pre_observation_quote="", post_observation_quote=compacted)]
    )
    result = validate_extraction({"items": [elided, across_gap]}, group)
    assert [item.id for item in result.accepted] == ["E1"]
    assert result.rejections == {"observation_quote_mismatch": 1}


def test_whitespace_differences_do_not_matter_but_words_do():
    loose = valid_item(
        evidence=[
            dict(
                valid_item()["evidence"][0], action_quote="open   fridge\n1", post_observation_quote="In it,\n you see"
            )
        ]
    )
    assert validate_extraction({"items": [loose]}, kitchen_group()).accepted


def test_item_limit_keeps_the_first_items():
    items = [valid_item(f"E{n}") for n in range(15)]
    result = validate_extraction({"items": items}, kitchen_group(), max_items=12)
    assert [item.id for item in result.accepted] == [f"E{n}" for n in range(12)]
    assert result.rejections == {"over_item_limit": 3}


def _aligned(**changes) -> dict:
    statement = {
        "statement": "Open the fridge before putting the apple in.",
        "evidence_ids": ["E1"],
        "target_quote": "go to fridge 1",
    }
    statement.update(changes)
    return statement


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({"target_id": 4, "statements": [_aligned(evidence_ids=["E9"])]}, "unknown_evidence_id"),
        ({"target_id": 4, "statements": [_aligned(evidence_ids=[])]}, "missing_evidence_ids"),
        ({"target_id": 4, "statements": [_aligned(target_quote="You clean the apple 1")]}, "unsupported_target_quote"),
        ({"target_id": 4, "statements": [_aligned(target_quote="fr")]}, "unsupported_target_quote"),
        ({"target_id": 4, "statements": [_aligned(statement="y" * 801)]}, "statement_too_long"),
        ({"target_id": 3, "statements": [_aligned()]}, "unknown_target"),
        ({"statements": [_aligned()]}, "unknown_target"),
        ({"target_id": 4, "statements": "all of them"}, "missing_statements"),
    ],
)
def test_alignment_validation_rejects(response, reason):
    group = kitchen_group()
    result = validate_alignment(response, 4, group[4], ["E1", "E2"])
    assert result.accepted == [] and result.rejections[reason] == 1


def test_alignment_validation_accepts_target_quotes_from_any_record():
    group = kitchen_group()
    quotes = ["go to fridge 1", "The fridge 1 is closed.", "a sinkbasin 1", "clean apple"]
    response = {"target_id": 4, "statements": [_aligned(target_quote=q) for q in quotes]}
    assert len(validate_alignment(response, 4, group[4], ["E1"]).accepted) == 4


def test_g_counts_the_analyzers_candidates_not_its_accepted_statements():
    # A.2: "accepted statements among the first G candidates". With G = 3 and candidate 2 citing an unknown id,
    # the accepted statements are candidates 1 and 3; candidates 4 and 5 are valid but not among the first 3.
    candidates = [_aligned(statement=f"Statement {n}.") for n in range(1, 6)]
    candidates[1]["evidence_ids"] = ["E9"]
    result = validate_alignment({"target_id": 4, "statements": candidates}, 4, kitchen_group()[4], ["E1"], max_statements=3)
    assert [s.statement for s in result.accepted] == ["Statement 1.", "Statement 3."]
    assert result.rejections == {"unknown_evidence_id": 1, "over_statement_limit": 2}
    everything = validate_alignment({"target_id": 4, "statements": candidates}, 4, kitchen_group()[4], ["E1"], max_statements=None)
    assert len(everything.accepted) == 4


# ----------------------------------------------------------------------------------------------- step skills (OPID)


def _step_skill(**changes) -> dict:
    skill = {"step": 2, "skill": "Open the fridge before you put the apple in it.", "evidence_ids": ["E1"]}
    skill.update(changes)
    return skill


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({"target_id": 4, "step_skills": [_step_skill(step=5)]}, "invalid_step"),  # the target has steps 0-4
        ({"target_id": 4, "step_skills": [_step_skill(step=-1)]}, "invalid_step"),
        ({"target_id": 4, "step_skills": [_step_skill(step="2")]}, "invalid_step"),
        ({"target_id": 4, "step_skills": [_step_skill(step=True)]}, "invalid_step"),
        ({"target_id": 4, "step_skills": [_step_skill(skill=" ")]}, "empty_statement"),
        ({"target_id": 4, "step_skills": [_step_skill(skill="y" * 801)]}, "statement_too_long"),
        ({"target_id": 4, "step_skills": [_step_skill(evidence_ids=["E9"])]}, "unknown_evidence_id"),
        ({"target_id": 4, "step_skills": [_step_skill(evidence_ids=[])]}, "missing_evidence_ids"),
        ({"target_id": 4, "step_skills": ["open the fridge"]}, "step_skill_not_object"),
        ({"target_id": 3, "step_skills": [_step_skill()]}, "unknown_target"),
        ({"target_id": 4, "step_skills": {"2": "open the fridge"}}, "missing_step_skills"),
    ],
)
def test_step_skill_validation_rejects(response, reason):
    group = kitchen_group()
    result = validate_step_skills(response, 4, group[4], ["E1", "E2"])
    assert result.accepted == [] and result.rejections[reason] == 1


def test_at_most_five_step_skills_one_per_step_among_the_first_candidates():
    # OPID writes at most 5 step skills per trajectory. Candidates 1-5 are the first five; candidate 3 repeats
    # step 0, so it is rejected and leaves its place empty; candidates 6 and 7 are over the limit.
    steps = [0, 1, 0, 2, 3, 4, 4]
    candidates = [_step_skill(step=s, skill=f"Skill {n}.") for n, s in enumerate(steps, 1)]
    result = validate_step_skills({"target_id": "4", "step_skills": candidates}, 4, kitchen_group()[4], ["E1"])
    accepted = [(s.step, s.skill) for s in result.accepted]
    assert accepted == [(0, "Skill 1."), (1, "Skill 2."), (2, "Skill 4."), (3, "Skill 5.")]
    assert result.rejections == {"duplicate_step": 1, "over_step_skill_limit": 2}
    assert P.DEFAULT_MAX_STEP_SKILLS == 5


def test_step_skill_request_shows_the_alignment_view_and_the_limit():
    group = kitchen_group()
    item = EvidenceItem(
        "E1", "requirement", "Clean the apple.", [EvidenceRef(0, 3, "clean apple 1", post_observation_quote=CLEAN)]
    )
    payload = step_skill_payload(4, group[4], [item], max_step_skills=3)
    aligned = alignment_payload(4, group[4], [item])
    assert payload == {**aligned, "stage": "step_skills", "max_step_skills": 3}
    assert not _keys(payload) & P.OUTCOME_KEYS
    system, user = step_skill_messages(payload)
    assert "at most 3 steps" in system["content"] and json.loads(user["content"]) == payload


# ----------------------------------------------------------------------------------------------- exclusion


def test_exclusion_drops_items_only_the_target_supports():
    only_2 = EvidenceItem("E1", "requirement", "a", [EvidenceRef(2, 3, "move apple 1 to diningtable 1")])
    shared = EvidenceItem("E2", "requirement", "b", [EvidenceRef(0, 1, "take"), EvidenceRef(2, 1, "take")])
    only_0 = EvidenceItem("E3", "requirement", "c", [EvidenceRef(0, 1, "take"), EvidenceRef(0, 3, "clean")])
    items = [only_2, shared, only_0]
    assert [i.id for i in exclude_target_only(items, 2)] == ["E2", "E3"]
    assert [i.id for i in exclude_target_only(items, 0)] == ["E1", "E2"]
    assert [i.id for i in exclude_target_only(items, 4)] == ["E1", "E2", "E3"]


def test_exclusion_removes_the_targets_own_steps_from_co_supported_items():
    own = EvidenceRef(0, 1, "take apple 1 from countertop 1", post_observation_quote=TAKE)
    other = EvidenceRef(2, 1, "take apple 2 from countertop 2", post_observation_quote="You pick up the apple 2")
    shared = EvidenceItem("E1", "requirement", "Take the apple.", [own, other])
    [kept] = exclude_target_only([shared], 0)
    assert kept.evidence == [other] and (kept.id, kept.kind, kept.statement) == ("E1", "requirement", "Take the apple.")
    assert shared.evidence == [own, other]  # the group's extraction is shared by every target: left untouched
    payload = alignment_payload(0, kitchen_group()[0], [kept])
    assert payload["allowed_evidence"][0]["source_actions"] == ["take apple 2 from countertop 2"]
    # For any other target both sources are external evidence.
    [both] = exclude_target_only([shared], 4)
    assert both.evidence == [own, other]


# ----------------------------------------------------------------------------------------------- composition


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_compose_wraps_bullets_of_the_distinct_statements(embedded_tokenizer):
    statements = [f"Statement number {n}." for n in range(10)] + ["Statement number 0."]
    text = compose_pi(statements, embedded_tokenizer, token_budget=256)
    assert text.startswith(PI_HEADER + "\n- Statement number 0.") and text.endswith("\n" + PI_FOOTER)
    assert text.count("\n- ") == 10 and text.count("number 0.") == 1
    assert compose_pi([], embedded_tokenizer) == "" and compose_pi(["  "], embedded_tokenizer) == ""


@settings(max_examples=25, deadline=None)
@given(
    statements=st.lists(
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=300),
        min_size=1,
        max_size=10,
    ),
    budget=st.integers(min_value=1, max_value=300),
)
def test_compose_never_exceeds_the_token_budget(embedded_tokenizer, statements, budget):
    text = compose_pi(statements, embedded_tokenizer, token_budget=budget)
    assert _tokens(embedded_tokenizer, text) <= budget


def test_compose_truncates_guidance_inside_the_wrapper(embedded_tokenizer):
    statements = ["Open the fridge 1 before you move the apple 1 to it. " * 3 + f"({n})" for n in range(8)]
    wrapper = _tokens(embedded_tokenizer, f"{PI_HEADER}\n\n{PI_FOOTER}")
    text = compose_pi(statements, embedded_tokenizer, token_budget=64)
    assert text.startswith(PI_HEADER) and text.endswith(PI_FOOTER)
    body = text[len(PI_HEADER) + 1 : -len(PI_FOOTER) - 1]
    assert _tokens(embedded_tokenizer, body) <= 64 - wrapper
    assert _tokens(embedded_tokenizer, body) >= 64 - wrapper - 2
    assert _tokens(embedded_tokenizer, text) <= 64


def test_compose_drops_the_wrapper_when_it_does_not_fit(embedded_tokenizer):
    wrapper = _tokens(embedded_tokenizer, f"{PI_HEADER}\n\n{PI_FOOTER}")
    text = compose_pi(
        ["Go to the sinkbasin 1 and clean the apple 1 there before cooling it."],
        embedded_tokenizer,
        token_budget=wrapper,
    )
    assert PI_HEADER not in text and text.startswith("- Go to")
    assert _tokens(embedded_tokenizer, text) <= wrapper


def test_validation_does_not_mutate_the_response():
    response = {"items": [valid_item()]}
    before = copy.deepcopy(response)
    validate_extraction(response, kitchen_group())
    assert response == before
