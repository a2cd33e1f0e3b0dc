"""SkillBank: JSONL validation, shipped banks, relevance retrieval, rendering and the skill_lookup hook."""

from __future__ import annotations

import json
import re
import zlib

import pytest
import torch

from taspo_trl.envs.alfworld.tasks import TASK_TYPES
from taspo_trl.privileged.skillbank import (
    SHIPPED_BANKS,
    SKILLS_FOOTER,
    SKILLS_HEADER,
    Skill,
    SkillBank,
    SkillBankError,
    add_skill_guidance,
    parse_skills,
    render_skills,
    shipped_bank_path,
    task_query,
)

HEAT = "pick_heat_then_place_in_recep"
ALFWORLD_INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see "
    "a cabinet 1, a countertop 1, a countertop 2, a drawer 1, a fridge 1, a microwave 1, a sinkbasin 1, and a "
    "stoveburner 1.\n\nYour task is to: "
)


class CountingEncoder:
    """A tiny deterministic bag-of-words encoder that counts its calls (for the retrieval logic)."""

    dim = 64

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode(self, texts):
        texts = list(texts)
        self.calls.append(texts)
        out = torch.zeros((len(texts), self.dim))
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        return out / out.norm(dim=1, keepdim=True).clamp_min(1e-12)


def record(i, **overrides):
    base = {
        "id": f"s{i}",
        "env": "toy",
        "title": f"title {i}",
        "skill": f"skill text {i}",
    }
    base.update(overrides)
    return base


def write_jsonl(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def alfworld(encoder):
    return SkillBank.load("alfworld", encoder=encoder)


# ----------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "bad_line, problem",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"id": "x", "env": "toy", "title": "t"}), "missing key 'skill'"),
        (json.dumps(record(9, skill="   ")), "'skill' is empty"),
        (json.dumps(record(9, title=7)), "'title' is not a string"),
        (json.dumps(record(1)), "duplicate id 's1' (first on line 1)"),
        (json.dumps(record(9, task_type=["a"])), "unknown key(s) 'task_type'"),
        (
            json.dumps(record(9, task_types="pick_and_place_simple")),
            "'task_types' must be a list",
        ),
        (json.dumps(record(9, task_types=["ok", ""])), "'task_types' must be a list"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_validation_names_file_line_and_problem(tmp_path, bad_line, problem):
    path = write_jsonl(tmp_path / "bank.jsonl", [record(1), "", bad_line, record(2)])
    with pytest.raises(SkillBankError) as info:
        SkillBank.load(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:3: "), message
    assert problem in message


def test_valid_bank_parses(tmp_path):
    path = write_jsonl(
        tmp_path / "bank.jsonl",
        [record(1, task_types=["a", "b"]), "", record(2, meta={"source": "me"})],
    )
    bank = SkillBank.load(path)
    assert len(bank) == 2 and "s1" in bank and "s3" not in bank
    assert bank["s1"].task_types == ("a", "b")
    assert bank["s2"].task_types == () and bank["s2"].meta == {"source": "me"}
    assert bank.task_types == ("a", "b")
    assert [skill.id for skill in bank] == ["s1", "s2"]


def test_a_bank_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "bank.jsonl"
    good = json.dumps(record(1)).encode()
    path.write_bytes(good + b"\n" + json.dumps(record(2)).encode().replace(b"skill", b"sk\xe9ll", 1) + b"\n")
    with pytest.raises(SkillBankError, match=rf"^{re.escape(str(path))}:2: not UTF-8 .*save the skill bank as UTF-8"):
        SkillBank.load(path)


@pytest.mark.parametrize("env", [None, "webshop"])
def test_an_empty_bank_is_refused(tmp_path, env):
    lines = [] if env is None else [record(1)]
    path = write_jsonl(tmp_path / "bank.jsonl", lines)
    with pytest.raises(SkillBankError, match="holds no skills.*leave skill_bank unset"):
        SkillBank.load(path, env=env)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        SkillBank.load(tmp_path / "nope.jsonl")


def test_save_round_trip(tmp_path):
    bank = SkillBank.from_records([record(1, task_types=["a"]), record(2, meta={"k": 1})])
    bank.save(tmp_path / "out.jsonl")
    again = SkillBank.load(tmp_path / "out.jsonl")
    assert again.skills == bank.skills
    assert again["s2"].meta == {"k": 1}


def test_in_memory_records_are_validated():
    with pytest.raises(SkillBankError, match=r"<records>:2: duplicate id"):
        SkillBank.from_records([record(1), record(1)])
    with pytest.raises(SkillBankError, match="duplicate id"):
        SkillBank([Skill("a", "toy", "t", "s"), Skill("a", "toy", "t2", "s2")])


# ----------------------------------------------------------------------------------------------- shipped banks


@pytest.mark.parametrize("name", SHIPPED_BANKS)
def test_shipped_banks_load_and_validate(name):
    path = shipped_bank_path(name)
    assert path.is_file()
    skills = parse_skills(path.read_text(encoding="utf-8"), source=str(path))
    bank = SkillBank.load(name)
    assert bank.skills == tuple(skills)
    assert {skill.env for skill in bank} == {name}
    assert len(bank) >= {"alfworld": 20, "webshop": 12, "searchqa": 10}[name]
    for skill in bank:
        assert len(skill.skill) <= 400, skill.id  # concise
        assert "\n" not in skill.text


def test_alfworld_bank_covers_every_task_family():
    bank = SkillBank.load("alfworld")
    assert set(bank.task_types) == set(TASK_TYPES)
    general = [skill for skill in bank if not skill.task_types]
    assert len(general) >= 5
    text = " ".join(skill.skill for skill in bank)
    for command in (
        "go to",
        "open ",
        "take ",
        "move ",
        "heat ",
        "cool ",
        "clean ",
        "use desklamp",
        "examine",
    ):
        assert command in text, command
    assert not re.search(r"'put \w+ \d", text)  # the installed grammar has no 'put' command: 'move X to Y'
    assert "move obj 1 to recep 1" in text


def test_webshop_and_searchqa_use_their_action_syntax():
    webshop = " ".join(skill.skill for skill in SkillBank.load("webshop"))
    assert "search[" in webshop and "click[Buy Now]" in webshop
    searchqa = " ".join(skill.skill for skill in SkillBank.load("searchqa"))
    assert "<search>" in searchqa and "<answer>" in searchqa


# ----------------------------------------------------------------------------------------------- retrieval logic


def test_task_query_keeps_the_alfworld_goal():
    assert task_query(ALFWORLD_INTRO + "heat some egg and put it in countertop.") == (
        "heat some egg and put it in countertop."
    )
    assert task_query("  buy a red\n shirt ") == "buy a red shirt"


def test_bank_embeddings_are_cached_and_queries_batched():
    fake = CountingEncoder()
    bank = SkillBank.from_records(
        [
            record(1, title="heat food", skill="use the microwave"),
            record(2, title="cool food", skill="use the fridge"),
        ],
        encoder=fake,
    )
    first = bank.retrieve_batch(["heat the egg", "cool the lettuce", "heat the mug"], k=1)
    assert [[s.id for s in row] for row in first] == [["s1"], ["s2"], ["s1"]]
    bank.retrieve("heat the potato")
    assert len(fake.calls) == 3  # one call per retrieve_batch / retrieve, the bank once
    assert fake.calls[0] == ["heat the egg", "cool the lettuce", "heat the mug"]
    assert fake.calls[1] == [
        "heat food: use the microwave",
        "cool food: use the fridge",
    ]
    assert fake.calls[2] == ["heat the potato"]


def test_task_type_filter_and_general_skills():
    fake = CountingEncoder()
    bank = SkillBank.from_records(
        [
            record(1, title="heat food", skill="microwave", task_types=["heat"]),
            record(2, title="cool food", skill="fridge", task_types=["cool"]),
            record(3, title="explore", skill="look around"),
        ],
        encoder=fake,
    )
    assert [s.id for s in bank.retrieve("heat food microwave", k=3, task_type="cool")] == ["s2", "s3"]
    assert [s.id for s in bank.retrieve("heat food microwave", k=3)] == [
        "s1",
        "s2",
        "s3",
    ]
    assert [s.id for s in bank.retrieve("x", k=5, task_type="unknown")] == ["s3"]
    rows = bank.retrieve_batch(["cool", "cool"], k=3, task_types=["heat", None])
    assert [s.id for s in rows[0]] == ["s1", "s3"] and len(rows[1]) == 3
    with pytest.raises(ValueError, match="task_types"):
        bank.retrieve_batch(["a", "b"], k=1, task_types=["heat"])


def test_ties_break_by_bank_order():
    same = {"title": "same title", "skill": "same words"}
    forward = SkillBank.from_records(
        [record(1, **same), record(2, **same), record(3, **same)],
        encoder=CountingEncoder(),
    )
    backward = SkillBank.from_records(
        [record(3, **same), record(2, **same), record(1, **same)],
        encoder=CountingEncoder(),
    )
    assert [s.id for s in forward.retrieve("same words", k=3)] == ["s1", "s2", "s3"]
    assert [s.id for s in backward.retrieve("same words", k=3)] == ["s3", "s2", "s1"]


def test_edge_cases():
    bank = SkillBank.from_records([record(1), record(2)], encoder=CountingEncoder())
    assert bank.retrieve("skill", k=0) == []
    assert len(bank.retrieve("skill", k=10)) == 2
    assert bank.retrieve_batch([], k=2) == []
    with pytest.raises(ValueError, match="k must be"):
        bank.retrieve("x", k=-1)
    with pytest.raises(TypeError, match="single string"):
        bank.retrieve_batch("one string", k=1)
    empty = SkillBank([], encoder=CountingEncoder())
    assert empty.retrieve("anything") == [] and empty.skill_lookup("anything") == ""


def test_render_format():
    skills = [
        Skill("a", "toy", "Open first", "Open  closed\nreceptacles."),
        Skill("b", "toy", "Move", "Use move."),
    ]
    block = render_skills(skills)
    assert block == f"{SKILLS_HEADER}\n- Open first: Open closed receptacles.\n- Move: Use move.\n{SKILLS_FOOTER}"
    assert SkillBank.render(skills, header=False) == "- Open first: Open closed receptacles.\n- Move: Use move."
    assert render_skills([]) == ""


# ----------------------------------------------------------------------------------------------- real retrieval


@pytest.mark.parametrize(
    "task",
    [
        "heat some apple and put it in countertop.",
        "put a hot mug in cabinet.",
        "heat some egg and put it in fridge.",
    ],
)
def test_heat_task_retrieves_the_heat_skill(alfworld, task):
    top = alfworld.retrieve(ALFWORLD_INTRO + task, k=2, task_type=HEAT)
    assert "alf-heat-microwave" in [s.id for s in top]
    assert all(s.applies_to(HEAT) for s in top)


def test_family_skills_rank_first_without_a_task_type(alfworld):
    cases = {
        "heat some potato and put it in diningtable.": "alf-heat-microwave",
        "cool some lettuce and put it in countertop.": "alf-cool-fridge",
        "clean some fork and put it in drawer.": "alf-clean-sinkbasin",
        "look at book under the desklamp.": "alf-look-lamp",
        "find two pen and put them in desk.": "alf-two-one-at-a-time",
    }
    rows = alfworld.retrieve_batch([ALFWORLD_INTRO + task for task in cases], k=2)
    for (task, wanted), row in zip(cases.items(), rows):
        assert wanted in [s.id for s in row], (task, [s.id for s in row])


def test_task_type_filter_on_the_shipped_bank(alfworld):
    rows = alfworld.retrieve_batch_with_scores(
        ["cool some apple and put it in microwave."] * 2, k=5, task_types=[HEAT, None]
    )
    filtered, unfiltered = rows
    assert all(not s.task_types or HEAT in s.task_types for s, _ in filtered)
    assert "alf-cool-fridge" not in [s.id for s, _ in filtered]
    assert "alf-cool-fridge" in [s.id for s, _ in unfiltered]
    assert [score for _, score in unfiltered] == sorted((score for _, score in unfiltered), reverse=True)


def test_retrieval_is_deterministic_and_batch_consistent(alfworld):
    tasks = [
        ALFWORLD_INTRO + t
        for t in (
            "put a clean cloth in cabinet.",
            "put some spraybottle on toilet.",
            "examine the alarmclock with the desklamp.",
        )
    ]
    types = [
        "pick_clean_then_place_in_recep",
        "pick_and_place_simple",
        "look_at_obj_in_light",
    ]
    batched = alfworld.retrieve_batch(tasks, k=3, task_types=types)
    assert alfworld.retrieve_batch(tasks, k=3, task_types=types) == batched
    assert [alfworld.retrieve(t, k=3, task_type=tt) for t, tt in zip(tasks, types)] == batched


def test_skill_lookup_returns_the_rendered_skills(alfworld):
    task = ALFWORLD_INTRO + "heat some apple and put it in countertop."
    text = alfworld.skill_lookup(task, HEAT)
    top = alfworld.retrieve(task, k=2, task_type=HEAT)
    assert text == render_skills(top, header=False)
    assert len(text.splitlines()) == 2 and all(line.startswith("- ") for line in text.splitlines())
    assert "heat obj 1 with microwave 1" in text
    with_header = alfworld.make_skill_lookup(k=3, header=True)(task, HEAT)
    assert with_header.startswith(SKILLS_HEADER + "\n") and with_header.endswith("\n" + SKILLS_FOOTER)
    assert len(with_header.splitlines()) == 5
    assert alfworld.render_batch([task], k=2, task_types=[HEAT], header=False) == [text]


def test_other_shipped_banks_retrieve_sensibly(encoder):
    webshop = SkillBank.load("webshop", encoder=encoder)
    top = webshop.retrieve(
        "i want women's running shoes in size 8, black, price lower than 60.00 dollars",
        k=3,
    )
    assert "ws-size-fit" in [s.id for s in top]
    searchqa = SkillBank.load("searchqa", encoder=encoder)
    top = searchqa.retrieve("Which is older, the Eiffel Tower or the Statue of Liberty?", k=2)
    assert "sq-comparison" in [s.id for s in top]


def test_skill_guidance_for_the_policy_prompt_lives_with_the_bank(encoder):
    """Training's and evaluation's prompt skills come from one function of the skill bank module (evaluation need
    not import a trainer): each task gets its own top-k skills as a [Skills] block; a task no skill applies to
    gets no guidance key at all."""
    assert add_skill_guidance.__module__ == "taspo_trl.privileged.skillbank"
    bank = SkillBank.from_records(
        [
            record(1, task_types=["heat"], title="Heat with the microwave", skill="Take it to the microwave 1."),
            record(2, task_types=["heat"], title="Find the object", skill="Look on countertops first."),
            record(3, task_types=["clean"], title="Clean in the sink", skill="Use the sinkbasin 1."),
        ],
        encoder=encoder,
    )
    specs = [
        {"task": "heat some apple", "task_type": "heat"},
        {"task": "clean some mug", "task_type": "clean"},
        {"task": "look at the book", "task_type": "look"},
    ]
    add_skill_guidance(specs, bank, top_k=2)
    heat_block = specs[0]["guidance"].splitlines()
    assert heat_block[0] == SKILLS_HEADER and heat_block[-1] == SKILLS_FOOTER
    assert sorted(heat_block[1:-1]) == [
        "- Find the object: Look on countertops first.",
        "- Heat with the microwave: Take it to the microwave 1.",
    ]
    assert specs[1]["guidance"] == f"{SKILLS_HEADER}\n- Clean in the sink: Use the sinkbasin 1.\n{SKILLS_FOOTER}"
    assert "guidance" not in specs[2]
