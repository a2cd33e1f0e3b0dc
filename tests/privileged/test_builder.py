"""The per-group PI pipeline (Eq. 2, Algorithm 1 lines 5-9), the batch entry point, the Table 2 ablation
sources, and failure handling end to end over real HTTP: no analyzer failure may escape the builder."""

from __future__ import annotations

import json
import logging

import pytest

from taspo_trl.privileged import (
    PI_FOOTER,
    PI_HEADER,
    OpenAICompatibleAnalyzer,
    RuleBasedAnalyzer,
    build_batch,
    build_batch_pi,
    build_group_pi,
    compose_pi,
)
from tests.helpers.analyzer_server import ReplayServer
from tests.helpers.kitchen import SOLVE, kitchen_group, make_trajectory

EXTRACTION = '"stage": "extraction"'


class Recorder:
    """Wraps an analyzer and keeps every (request, answer) pair."""

    def __init__(self, inner, workers: int = 1) -> None:
        self.inner, self.workers, self.calls = inner, workers, []

    def complete(self, messages):
        text = self.inner.complete(messages)
        self.calls.append((json.loads(messages[-1]["content"]), text))
        return text


def failed_group(group: int = 1) -> list:
    return [make_trajectory(SOLVE[:3], won=False, group=group) for _ in range(3)]


def tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


# ----------------------------------------------------------------------------------------------- aligned source


def test_aligned_pi_for_every_target_of_a_group(embedded_tokenizer):
    recorder = Recorder(RuleBasedAnalyzer())
    result = build_group_pi(kitchen_group(), recorder, embedded_tokenizer)
    assert len(result.texts) == 5 and result.texts[3] == ""
    for text in result.texts[:3] + result.texts[4:]:
        assert text.startswith(PI_HEADER) and text.endswith(PI_FOOTER)
        assert tokens(embedded_tokenizer, text) <= 256
    assert "clean apple 1 with sinkbasin 1" in result.texts[4]
    stats = result.stats
    assert (stats.trajectories, stats.with_pi, stats.groups, stats.analyzer_calls) == (5, 4, 1, 6)
    assert stats.coverage == pytest.approx(0.8)
    # Every answer passes every check; only candidates past the first G = 8 of a target go unused.
    assert stats.fallbacks == {"no_aligned_statements": 1} and set(stats.rejections) <= {"over_statement_limit"}
    assert stats.accepted_items == len(result.items) == 12
    # One extraction over the three successes; the alignment payloads never carry outcome labels.
    stages = [payload["stage"] for payload, _ in recorder.calls]
    assert stages.count("extraction") == 1 and stages.count("alignment") == 5
    extraction = next(p for p, _ in recorder.calls if p["stage"] == "extraction")
    assert [s["trajectory_id"] for s in extraction["successes"]] == [0, 1, 2]
    for payload, _ in recorder.calls:
        if payload["stage"] == "alignment":
            assert not {"verified_success", "episode_reward", "won", "reward", "advantage"} & set(payload)


def test_target_only_support_leaves_a_lone_success_without_pi(embedded_tokenizer):
    group = kitchen_group()
    for trajectory in group[1:3]:
        trajectory.won, trajectory.reward = False, 0.0
    result = build_group_pi(group, RuleBasedAnalyzer(), embedded_tokenizer)
    assert result.texts[0] == "" and result.stats.fallbacks["no_items_after_exclusion"] == 1
    assert result.texts[1] and result.texts[4]


def test_group_without_success_gets_no_pi_and_no_analyzer_call(embedded_tokenizer):
    recorder = Recorder(RuleBasedAnalyzer())
    result = build_group_pi(failed_group(), recorder, embedded_tokenizer)
    assert result.texts == ["", "", ""] and recorder.calls == []
    assert result.stats.fallbacks == {"no_success": 3} and result.stats.coverage == 0.0


def test_budget_and_statement_limit_are_applied(embedded_tokenizer):
    result = build_group_pi(kitchen_group(), RuleBasedAnalyzer(), embedded_tokenizer, max_statements=2, token_budget=48)
    assert all(tokens(embedded_tokenizer, text) <= 48 for text in result.texts)
    assert all(text.count("\n- ") <= 2 for text in result.texts)


def _renamed(steps: list[tuple[str, str]], renames: dict[str, str]) -> list[tuple[str, str]]:
    def rename(text: str) -> str:
        for old, new in renames.items():
            text = text.replace(old, new)
        return text

    return [(rename(action), rename(observation)) for action, observation in steps]


def test_alignment_requests_show_no_source_step_of_the_target(embedded_tokenizer):
    # Two successes take different apples from different countertops, so every item both support has one
    # source action of each; a target's own steps must never be shown to it as source evidence.
    other_apple = _renamed(SOLVE, {"apple 1": "apple 2", "countertop 1": "countertop 2"})
    group = [make_trajectory(SOLVE, won=True), make_trajectory(other_apple, won=True), kitchen_group()[4]]
    recorder = Recorder(RuleBasedAnalyzer())
    build_group_pi(group, recorder, embedded_tokenizer)
    alignments = {p["target_id"]: p for p, _ in recorder.calls if p["stage"] == "alignment"}
    assert sorted(alignments) == [0, 1, 2]
    for target, payload in alignments.items():
        external = {turn.action for i, t in enumerate(group) if t.won and i != target for turn in t.turns}
        shown = {action for item in payload["allowed_evidence"] for action in item["source_actions"]}
        assert shown and shown <= external, target
    # The failed target sees both successes' steps.
    assert {"take apple 1 from countertop 1", "take apple 2 from countertop 2"} <= {
        a for item in alignments[2]["allowed_evidence"] for a in item["source_actions"]
    }


class _ManyCandidates:
    """Extraction by the rule-based analyzer; every alignment answers five candidates, the second citing an
    evidence id that does not exist."""

    workers = 1

    def complete(self, messages):
        payload = json.loads(messages[-1]["content"])
        if payload["stage"] == "extraction":
            return RuleBasedAnalyzer().complete(messages)
        cited, quote = payload["allowed_evidence"][0]["id"], payload["steps"][0]["action"]
        statements = [
            {"statement": f"Candidate {n}.", "evidence_ids": ["E99" if n == 2 else cited], "target_quote": quote}
            for n in range(1, 6)
        ]
        return json.dumps({"target_id": payload["target_id"], "statements": statements})


def test_pi_composes_the_accepted_statements_among_the_first_g_candidates(embedded_tokenizer):
    result = build_group_pi(kitchen_group(), _ManyCandidates(), embedded_tokenizer, max_statements=3)
    # G = 3: candidates 1 and 3 are accepted among the first three; 4 and 5 are past them, though valid.
    expected = f"{PI_HEADER}\n- Candidate 1.\n- Candidate 3.\n{PI_FOOTER}"
    assert result.texts == [expected] * 5
    assert result.stats.rejections == {"unknown_evidence_id": 5, "over_statement_limit": 2 * 5}


# ----------------------------------------------------------------------------------------------- batch


def test_batch_is_aligned_with_input_order_and_deterministic(embedded_tokenizer):
    batch = kitchen_group(0) + [make_trajectory(SOLVE[:3], won=False, group=1) for _ in range(5)] + kitchen_group(2)
    texts, stats = build_batch_pi(batch, 5, Recorder(RuleBasedAnalyzer(), workers=4), embedded_tokenizer)
    single = build_group_pi(kitchen_group(0), RuleBasedAnalyzer(), embedded_tokenizer).texts
    assert texts == single + [""] * 5 + single
    assert (stats.groups, stats.trajectories, stats.with_pi) == (3, 15, 8)
    assert stats.fallbacks == {"no_success": 5, "no_aligned_statements": 2}
    again, _ = build_batch_pi(batch, 5, RuleBasedAnalyzer(), embedded_tokenizer)
    assert again == texts


def test_batch_rejects_bad_grouping(embedded_tokenizer):
    with pytest.raises(ValueError, match="groups of 4"):
        build_batch_pi(kitchen_group(), 4, RuleBasedAnalyzer(), embedded_tokenizer)
    with pytest.raises(ValueError, match="mixes task groups"):
        build_batch_pi(kitchen_group(0)[:3] + kitchen_group(1)[:3], 2, RuleBasedAnalyzer(), embedded_tokenizer)


def test_source_settings_are_checked(embedded_tokenizer):
    with pytest.raises(ValueError, match="unknown PI source"):
        build_group_pi(kitchen_group(), None, embedded_tokenizer, source="oracle")
    with pytest.raises(ValueError, match="needs an analyzer"):
        build_group_pi(kitchen_group(), None, embedded_tokenizer)
    with pytest.raises(ValueError, match="skill_lookup"):
        build_group_pi(kitchen_group(), None, embedded_tokenizer, source="generic_skill")


# ----------------------------------------------------------------------------------------------- Table 2 ablations


def test_nearest_success_renders_the_most_similar_other_success(embedded_tokenizer):
    group = kitchen_group()
    result = build_group_pi(group, None, embedded_tokenizer, source="nearest_success")
    # Target 4 skipped cleaning; success 0 (the plain solution) shares the most action words with it.
    assert result.texts[4].startswith(PI_HEADER + "\n- step 1: go to countertop 1 -> You arrive at countertop 1.")
    assert "diningtable" not in result.texts[4]
    # A success never gets its own trajectory: the plain solution's nearest other success is the detour (1).
    assert "step 1: go to diningtable 1" in result.texts[0]
    assert all(tokens(embedded_tokenizer, t) <= 256 for t in result.texts) and result.stats.coverage == 1.0


def test_random_success_is_seeded_and_never_the_target(embedded_tokenizer):
    group = kitchen_group()
    first = build_group_pi(group, None, embedded_tokenizer, source="random_success", seed=3).texts
    assert build_group_pi(group, None, embedded_tokenizer, source="random_success", seed=3).texts == first
    renders = {
        n: build_group_pi(group, None, embedded_tokenizer, source="random_success", seed=n).texts for n in range(8)
    }
    assert len({texts[3] for texts in renders.values()}) > 1
    solo = group[:1] + group[3:]
    result = build_group_pi(solo, None, embedded_tokenizer, source="random_success")
    assert result.texts[0] == "" and result.stats.fallbacks == {"no_other_success": 1}


def test_generic_skill_uses_the_callers_lookup(embedded_tokenizer):
    asked = []

    def lookup(task, task_type):
        asked.append((task, task_type))
        return "- Find the object first.\n- Clean objects at a sinkbasin.\n"

    result = build_group_pi(failed_group(), None, embedded_tokenizer, source="generic_skill", skill_lookup=lookup)
    assert result.texts[0] == f"{PI_HEADER}\n- Find the object first.\n- Clean objects at a sinkbasin.\n{PI_FOOTER}"
    assert asked[0] == ("put a clean apple in fridge.", "pick_clean_then_place_in_recep")

    def broken(task, task_type):
        raise KeyError(task_type)

    result = build_group_pi(failed_group(), None, embedded_tokenizer, source="generic_skill", skill_lookup=broken)
    assert result.texts == ["", "", ""] and result.stats.fallbacks == {"skill_lookup_failed": 3}


# ----------------------------------------------------------------------------------------------- Skill-SD's skills


def test_success_skills_summarise_the_other_successes_without_alignment(embedded_tokenizer):
    """Skill-SD's teacher context: the analyzer's items from the successes, each target seeing those another
    success supports, composed as skills; no alignment request, and no raw trajectory."""
    group = kitchen_group()
    recorder = Recorder(RuleBasedAnalyzer())
    result = build_group_pi(group, recorder, embedded_tokenizer, source="success_skills")
    assert [payload["stage"] for payload, _ in recorder.calls] == ["extraction"]
    items = result.items
    table_only = [item.statement for item in items if item.support == {2}]  # the detour only success 2 made
    assert table_only
    for target, text in enumerate(result.texts):
        kept = [item.statement for item in items if item.support - {target}]
        assert text == compose_pi(kept, embedded_tokenizer, 256) and text.startswith(PI_HEADER)
        assert "step 1:" not in text  # summarised skills, not a rendered sibling
    assert not any(statement in result.texts[2] for statement in table_only)
    assert result.stats.coverage == 1.0 and result.stats.with_pi == 5
    lone = group[:1] + group[3:]  # one success: nothing is supported by a success other than itself
    alone = build_group_pi(lone, RuleBasedAnalyzer(), embedded_tokenizer, source="success_skills")
    assert alone.texts[0] == "" and alone.stats.fallbacks == {"no_items_after_exclusion": 1}
    assert build_group_pi(failed_group(), RuleBasedAnalyzer(), embedded_tokenizer, source="success_skills").texts == [
        "", "", ""
    ]


# ----------------------------------------------------------------------------------------------- OPID's step skills


def test_step_skills_are_written_per_target_next_to_its_pi(embedded_tokenizer):
    recorder = Recorder(RuleBasedAnalyzer())
    result = build_group_pi(kitchen_group(), recorder, embedded_tokenizer, max_step_skills=5)
    assert result.texts == build_group_pi(kitchen_group(), RuleBasedAnalyzer(), embedded_tokenizer).texts
    stages = [payload["stage"] for payload, _ in recorder.calls]
    assert stages.count("extraction") == 1 and stages.count("step_skills") == 5  # the one extraction serves both
    assert [len(skills) for skills in result.step_skills][3] == 0  # never found the apple: nothing applies
    for target, skills in enumerate(result.step_skills):
        assert len(skills) <= 5 and all(0 <= step < kitchen_group()[target].num_turns for step in skills)
        for text in skills.values():
            assert text.startswith(PI_HEADER) and text.count("\n- ") == 1  # one skill per step context
    assert result.stats.step_skills == sum(map(len, result.step_skills)) > 0
    assert result.stats.with_step_skills == 4
    assert not [reason for reason in result.stats.rejections if reason.startswith("step_skills/")]
    capped = build_group_pi(kitchen_group(), RuleBasedAnalyzer(), embedded_tokenizer, max_step_skills=1)
    assert all(len(skills) <= 1 for skills in capped.step_skills) and capped.stats.step_skills == 4


def test_step_skills_without_success_or_with_another_source(embedded_tokenizer):
    recorder = Recorder(RuleBasedAnalyzer())
    nothing = build_group_pi(failed_group(), recorder, embedded_tokenizer, max_step_skills=5)
    assert nothing.step_skills == [{}, {}, {}] and recorder.calls == []

    def lookup(task, task_type):
        return "- Find the object first."

    # The episode context may come from any source; the step skills still come from the analyzer.
    mixed = build_group_pi(
        kitchen_group(), RuleBasedAnalyzer(), embedded_tokenizer, source="generic_skill", skill_lookup=lookup,
        max_step_skills=5,
    )
    assert all(text == f"{PI_HEADER}\n- Find the object first.\n{PI_FOOTER}" for text in mixed.texts)
    assert sum(map(len, mixed.step_skills)) > 0 and mixed.stats.groups == 1 and mixed.stats.analyzer_calls == 6
    both = kitchen_group(0) + kitchen_group(1)
    batch = build_batch(both, 5, RuleBasedAnalyzer(), embedded_tokenizer, max_step_skills=5)
    assert batch.step_skills == mixed.step_skills * 2 and len(batch.texts) == 10
    with pytest.raises(ValueError, match="step skills are written by an analyzer"):
        build_group_pi(kitchen_group(), None, embedded_tokenizer, source="nearest_success", max_step_skills=5)
    with pytest.raises(ValueError, match="max_step_skills must be >= 0"):
        build_group_pi(kitchen_group(), RuleBasedAnalyzer(), embedded_tokenizer, max_step_skills=-1)


# ----------------------------------------------------------------------------------------------- over real HTTP


@pytest.fixture(scope="module")
def server():
    replay = ReplayServer()
    yield replay
    replay.close()


@pytest.fixture(scope="module")
def transcript(embedded_tokenizer):
    """What the rule-based analyzer answers for the kitchen group: the extraction, and alignment per target."""
    recorder = Recorder(RuleBasedAnalyzer())
    expected = build_group_pi(kitchen_group(), recorder, embedded_tokenizer).texts
    extraction = next(text for payload, text in recorder.calls if payload["stage"] == "extraction")
    alignments = {payload["target_id"]: text for payload, text in recorder.calls if payload["stage"] == "alignment"}
    return extraction, alignments, expected


def script(server, extraction: list[dict], alignments: dict[int, list[dict]]) -> None:
    rules = [{"match": EXTRACTION, "responses": extraction}]
    rules += [{"match": f'"target_id": {i},', "responses": responses} for i, responses in alignments.items()]
    server.script(rules)


def remote(server, **kwargs) -> OpenAICompatibleAnalyzer:
    return OpenAICompatibleAnalyzer(server.base_url, "replay-model", **{"timeout": 5, "max_retries": 0, **kwargs})


def test_remote_answers_in_prose_and_fences_give_the_same_pi(server, transcript, embedded_tokenizer):
    extraction, alignments, expected = transcript
    script(
        server,
        [{"content": f"I looked at the successes. Result:\n{extraction}\nLet me know if you need more."}],
        {i: [{"content": f"```json\n{text}\n```"}] for i, text in alignments.items()},
    )
    result = build_group_pi(kitchen_group(), remote(server), embedded_tokenizer)
    assert result.texts == expected
    assert server.stats()["requests"] == 6 and set(result.stats.rejections) <= {"over_statement_limit"}


def test_malformed_extraction_empties_the_group(server, embedded_tokenizer, caplog):
    script(server, [{"content": '{"items": [{"id": "E1", "statement": "Open the fridge"'}], {})
    with caplog.at_level(logging.WARNING, logger="taspo_trl.privileged.builder"):
        result = build_group_pi(kitchen_group(), remote(server), embedded_tokenizer)
    assert result.texts == [""] * 5
    assert result.stats.rejections == {"no_json_object": 1} and result.stats.fallbacks == {"extraction_failed": 5}
    assert "analyzer answer rejected" in caplog.text


def test_invented_quote_discards_only_that_item(server, transcript, embedded_tokenizer):
    extraction, alignments, _ = transcript
    answer = json.loads(extraction)
    opened = next(item for item in answer["items"] if item["statement"].startswith("Open the fridge"))
    opened["evidence"][1]["post_observation_quote"] = "You unlock the fridge 1 with the golden key 1."
    script(server, [{"content": json.dumps(answer)}], {i: [{"content": text}] for i, text in alignments.items()})
    result = build_group_pi(kitchen_group(), remote(server), embedded_tokenizer)
    assert result.stats.rejections["observation_quote_mismatch"] == 1
    assert opened["id"] not in {item.id for item in result.items}
    # The replayed alignments still cite the rejected item: those statements are discarded, the rest kept.
    assert result.stats.rejections["unknown_evidence_id"] == 4
    assert result.texts[0] and "Open the fridge" not in "".join(result.texts)


def test_timeout_empties_only_that_target(server, transcript, embedded_tokenizer, caplog):
    extraction, alignments, expected = transcript
    responses = {i: [{"content": text}] for i, text in alignments.items()}
    responses[0] = [{"content": alignments[0], "delay": 1.5}]
    script(server, [{"content": extraction}], responses)
    with caplog.at_level(logging.WARNING, logger="taspo_trl.privileged.builder"):
        result = build_group_pi(kitchen_group(), remote(server, timeout=0.5, workers=4), embedded_tokenizer)
    assert result.texts[0] == "" and result.texts[1:] == expected[1:]
    assert result.stats.fallbacks["alignment_failed"] == 1 and result.stats.analyzer_errors == 1
    assert "APITimeoutError" in caplog.text


def test_http_500_is_retried_then_the_group_gets_no_pi(server, embedded_tokenizer, caplog):
    script(server, [{"status": 500, "content": "internal error"}], {})
    with caplog.at_level(logging.WARNING, logger="taspo_trl.privileged.builder"):
        result = build_group_pi(kitchen_group(), remote(server, max_retries=2), embedded_tokenizer)
    assert result.texts == [""] * 5 and server.stats()["requests"] == 3
    assert result.stats.rejections == {"analyzer_error": 1} and result.stats.fallbacks == {"extraction_failed": 5}
    assert "InternalServerError" in caplog.text


def test_cached_rerun_does_not_contact_the_server(server, transcript, embedded_tokenizer, tmp_path):
    extraction, alignments, expected = transcript
    script(server, [{"content": extraction}], {i: [{"content": text}] for i, text in alignments.items()})
    batch = kitchen_group()
    first, first_stats = build_batch_pi(batch, 5, remote(server, cache_dir=tmp_path), embedded_tokenizer)
    assert server.stats()["requests"] == 6 and first_stats.cache_hits == 0
    second, second_stats = build_batch_pi(batch, 5, remote(server, cache_dir=tmp_path), embedded_tokenizer)
    assert second == first == expected
    assert server.stats()["requests"] == 6 and second_stats.cache_hits == 6
