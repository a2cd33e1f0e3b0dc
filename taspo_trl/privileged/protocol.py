"""The analyzer protocol of TASPO (Section 3.2, Eq. 2; Appendix A.2): records, compaction, validation, composition.

An analyzer is any text-in/text-out model. This module owns everything around it that must not depend on the
model: the compact JSON traces it reads, the prompts, pulling a JSON object out of its free-text answer, and
the evidence checks that decide which of its items and statements survive. Quotes are always checked against
the ORIGINAL trajectory records (whitespace-normalised substring match), never against the compacted traces
the analyzer saw, so an analyzer cannot cite text that the environment did not produce.

    P_i = Compose(Align(E_{x,-i}, x, H_i))                                            (Eq. 2)
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

# A.2's elision marker and statement cap are defined in the kit of the environments' analyzer rules, which may not
# import privileged/.
from ..envs.analysis import ELLIPSIS, MAX_STATEMENT_CHARS

if TYPE_CHECKING:  # records pull in the rollout package (torch); only their attributes are used here
    from ..rollout.records import Trajectory


# A.2 defaults.
DEFAULT_CHAR_BUDGET = 12_000
TASK_CHAR_CAP = 1_200
ACTION_CHAR_CAP = 320
MIN_OBSERVATION_CHARS = 40
DEFAULT_MAX_STATEMENTS = 8
DEFAULT_PI_TOKENS = 256
DEFAULT_MAX_ITEMS = 12  # Table C.3, "Maximum evidence items"
DEFAULT_MAX_STEP_SKILLS = 5  # OPID: at most 5 step-level skills per trajectory
# A quote of one or two characters is a substring of almost any record, so it would establish no traceability.
MIN_QUOTE_CHARS = 3

ITEM_KINDS = ("requirement", "precondition", "ordering")
PI_HEADER = "[Privileged Guidance]"
PI_FOOTER = "[End Privileged Guidance]"
# Keys that would reveal the outcome to the alignment stage (A.2, "Inputs and outcome visibility").
OUTCOME_KEYS = frozenset({"verified_success", "episode_reward", "won", "reward", "advantage"})


class AnalyzerResponseError(ValueError):
    """The analyzer's text holds no usable JSON object; ``reason`` is the counted rejection reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TokenizerLike(Protocol):
    """What composition needs from a tokenizer (any Hugging Face tokenizer fits)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class EvidenceRef:
    """One cited source step: a verified success's action and a quote from the observation before or after it."""

    trajectory_id: int
    step: int
    action_quote: str
    pre_observation_quote: str = ""
    post_observation_quote: str = ""


@dataclass
class EvidenceItem:
    """One extracted guidance item of E_x (a requirement, precondition or ordering constraint)."""

    id: str
    kind: str
    statement: str
    evidence: list[EvidenceRef]

    @property
    def support(self) -> frozenset[int]:
        """Group-local ids of the successful trajectories that support this item."""
        return frozenset(ref.trajectory_id for ref in self.evidence)


@dataclass
class AlignedStatement:
    """One statement retained (or reformulated) for a target: cites source items and the target's own record."""

    statement: str
    evidence_ids: list[str]
    target_quote: str


@dataclass
class StepSkill:
    """One step-level skill (OPID) for a target: the step it guides, the skill, and the evidence it rests on."""

    step: int
    skill: str
    evidence_ids: list[str]


@dataclass
class Validated:
    """What survived a validation pass, and how many of the rest failed for which reason."""

    accepted: list[Any] = field(default_factory=list)
    rejections: Counter = field(default_factory=Counter)


# ----------------------------------------------------------------------------------------------- compaction


def normalize_whitespace(text: str) -> str:
    """Collapse every whitespace run to one space and strip the ends (the form quotes are matched in)."""
    return " ".join(text.split())


def clip_middle(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` around " ... " so the result has at most ``limit`` characters (A.2)."""
    if len(text) <= limit:
        return text
    keep = limit - len(ELLIPSIS)
    if keep < 2:
        return text[:limit]
    head = (keep + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def _fair_share(lengths: list[int], budget: int, floor: int) -> int:
    """The largest per-field limit L >= ``floor`` with sum(min(len, L)) <= ``budget`` (water filling).

    Short fields keep their full text and their unused share goes to the long ones.
    """
    if sum(lengths) <= budget:
        return max(lengths, default=floor)
    remaining, count = budget, len(lengths)
    for length in sorted(lengths):
        share = remaining // count
        if length > share:
            return max(share, floor)
        remaining -= length
        count -= 1
    return max(lengths, default=floor)


def pre_observations(trajectory: Trajectory) -> list[str]:
    """The observation each action was taken from: the initial observation, then the previous turn's answer."""
    return [trajectory.initial_observation] + [turn.observation for turn in trajectory.turns[:-1]]


def compact_trace(trajectory: Trajectory, char_budget: int = DEFAULT_CHAR_BUDGET) -> dict[str, Any]:
    """A JSON-serialisable trace of ALL recorded steps, with outcome labels left out (A.2, "Context compaction").

    Fields are whitespace-normalised; the task keeps up to 1,200 characters and each action up to 320; the
    rest of ``char_budget`` is shared fairly among the observations, each keeping at least 40. The total text
    is within the budget unless those minima alone exceed it (so, as in the paper, C is approximate).
    """
    task = clip_middle(normalize_whitespace(trajectory.task), TASK_CHAR_CAP)
    actions = [clip_middle(normalize_whitespace(turn.action), ACTION_CHAR_CAP) for turn in trajectory.turns]
    pre = [normalize_whitespace(text) for text in pre_observations(trajectory)]
    post = [normalize_whitespace(turn.observation) for turn in trajectory.turns]
    remaining = char_budget - len(task) - sum(map(len, actions))
    limit = _fair_share([len(text) for text in pre + post], max(remaining, 0), MIN_OBSERVATION_CHARS)
    steps = [
        {
            "step": index,
            "action": action,
            "pre_observation": clip_middle(before, limit),
            "post_observation": clip_middle(after, limit),
        }
        for index, (action, before, after) in enumerate(zip(actions, pre, post))
    ]
    return {"task": task, "steps": steps}


# ----------------------------------------------------------------------------------------------- payloads and prompts

EXTRACTION_SYSTEM_PROMPT = f"""You analyse verified successful attempts at one text-environment task.
The user message is a JSON object: the task and the recorded steps of each successful trajectory (step index,
action, the observation before the action, the observation after it). Long fields are shortened with " ... ".
Extract conditional guidance that explains the successes: task requirements, action preconditions and ordering
constraints. Every item must cite the steps that support it, quoting the action and part of the observation
before or after it EXACTLY as written (never quote across a " ... " gap). Cite every successful trajectory that
supports an item: items supported by only one trajectory may be unusable.
Answer with one JSON object and nothing else:
{{"items": [{{"id": "E1", "kind": "requirement|precondition|ordering",
  "statement": "<= {MAX_STATEMENT_CHARS} characters", "evidence": [{{"trajectory_id": 0, "step": 3, "action_quote": "...", "pre_observation_quote": "...",
  "post_observation_quote": "..."}}]}}]}}
Use at most {{max_items}} items with unique ids."""

ALIGNMENT_SYSTEM_PROMPT = f"""You check which guidance applies to one target attempt at a text-environment task.
The user message is a JSON object: the target id, the task, every recorded step of the target (action,
observation before, observation after) and the allowed evidence items extracted from other attempts.
Keep or reformulate only the guidance that applies to the target's actual situation as its records show it.
Each statement must cite allowed evidence ids and quote the target's own records EXACTLY (an action, or part of
the task or of an observation; never quote across a " ... " gap).
Answer with one JSON object and nothing else:
{{"target_id": <the target id>, "statements": [{{"statement": "<= {MAX_STATEMENT_CHARS} characters",
  "evidence_ids": ["E1"], "target_quote": "..."}}]}}
Return an empty list when nothing applies."""

STEP_SKILL_SYSTEM_PROMPT = f"""You write step-level skills for one target attempt at a text-environment task.
The user message is a JSON object: the target id, the task, every recorded step of the target (step index,
action, observation before, observation after) and the allowed evidence items extracted from other attempts.
Pick at most {{max_step_skills}} steps of the target whose decision the evidence bears on, and write for each one a
short reusable skill for that decision, as it applies to the target's situation at that step. Each skill names
the step index and cites allowed evidence ids. At most one skill per step.
Answer with one JSON object and nothing else:
{{"target_id": <the target id>, "step_skills": [{{"step": 3, "skill": "<= {MAX_STATEMENT_CHARS} characters",
  "evidence_ids": ["E1"]}}]}}
Return an empty list when no step needs a skill."""


def extraction_payload(
    successes: dict[int, Trajectory], char_budget: int = DEFAULT_CHAR_BUDGET, max_items: int = DEFAULT_MAX_ITEMS
) -> dict[str, Any]:
    """The extraction request body: the task and the compact traces of the verified successes, keyed by id."""
    traces = {index: compact_trace(trajectory, char_budget) for index, trajectory in successes.items()}
    task = next(iter(traces.values()))["task"] if traces else ""
    return {
        "stage": "extraction",
        "task": task,
        "max_items": max_items,
        "successes": [
            {"trajectory_id": index, "verified_success": True, "steps": trace["steps"]}
            for index, trace in traces.items()
        ],
    }


def alignment_payload(
    target_id: int, target: Trajectory, items: Sequence[EvidenceItem], char_budget: int = DEFAULT_CHAR_BUDGET
) -> dict[str, Any]:
    """The alignment request body: the target's task and steps (no outcome labels) and the allowed items."""
    trace = compact_trace(target, char_budget)
    return {
        "stage": "alignment",
        "target_id": target_id,
        "task": trace["task"],
        "steps": trace["steps"],
        "allowed_evidence": [
            {
                "id": item.id,
                "kind": item.kind,
                "statement": item.statement,
                "source_actions": sorted({ref.action_quote for ref in item.evidence}),
            }
            for item in items
        ],
    }


def step_skill_payload(
    target_id: int,
    target: Trajectory,
    items: Sequence[EvidenceItem],
    char_budget: int = DEFAULT_CHAR_BUDGET,
    max_step_skills: int = DEFAULT_MAX_STEP_SKILLS,
) -> dict[str, Any]:
    """The step-skill request body (OPID): what alignment sees (the target's steps without outcome labels and the
    allowed items), asking for at most ``max_step_skills`` skills, each tied to one of the target's steps."""
    payload = alignment_payload(target_id, target, items, char_budget)
    return {**payload, "stage": "step_skills", "max_step_skills": max_step_skills}


def extraction_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """Chat messages for one extraction request."""
    system = EXTRACTION_SYSTEM_PROMPT.replace("{max_items}", str(payload["max_items"]))
    return [{"role": "system", "content": system}, {"role": "user", "content": json.dumps(payload, ensure_ascii=False)}]


def alignment_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """Chat messages for one alignment request."""
    return [
        {"role": "system", "content": ALIGNMENT_SYSTEM_PROMPT},
        {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
    ]


def step_skill_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """Chat messages for one step-skill request."""
    system = STEP_SKILL_SYSTEM_PROMPT.replace("{max_step_skills}", str(payload["max_step_skills"]))
    return [{"role": "system", "content": system}, {"role": "user", "content": json.dumps(payload, ensure_ascii=False)}]


# ----------------------------------------------------------------------------------------------- parsing

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in an analyzer's free-text answer: fenced, bare, or with prose around it.

    Servers may ignore JSON mode (``transformers serve`` does), so the object is searched for. A reply that is
    valid JSON but not an object is rejected rather than searched inside. Raises :class:`AnalyzerResponseError`.
    """
    for candidate in [block.strip() for block in _FENCE.findall(text)] + [text.strip()]:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
        raise AnalyzerResponseError(
            "response_not_object", f"analyzer returned JSON {type(value).__name__}, not an object"
        )
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise AnalyzerResponseError("no_json_object", "no JSON object found in the analyzer's answer")


# ----------------------------------------------------------------------------------------------- validation


def _quote_in(quote: Any, *records: str) -> bool:
    if not isinstance(quote, str):
        return False
    needle = normalize_whitespace(quote)
    return len(needle) >= MIN_QUOTE_CHARS and any(needle in normalize_whitespace(record) for record in records)


def _check_statement(statement: Any) -> str | None:
    if not isinstance(statement, str) or not statement.strip():
        return "empty_statement"
    if len(statement.strip()) > MAX_STATEMENT_CHARS:
        return "statement_too_long"
    return None


def _check_reference(ref: Any, group: Sequence[Trajectory]) -> tuple[EvidenceRef | None, str | None]:
    """A reference must name a step with a valid action of a verified success and quote it (A.2, "Validation")."""
    if not isinstance(ref, dict):
        return None, "reference_not_object"
    trajectory_id, step = ref.get("trajectory_id"), ref.get("step")
    if not isinstance(trajectory_id, int) or isinstance(trajectory_id, bool) or not 0 <= trajectory_id < len(group):
        return None, "unknown_trajectory"
    source = group[trajectory_id]
    if not source.won:
        return None, "reference_not_success"
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < len(source.turns):
        return None, "invalid_step"
    turn = source.turns[step]
    if not turn.action_valid or not turn.action.strip():
        return None, "invalid_action"
    if not _quote_in(ref.get("action_quote"), turn.action):
        return None, "action_quote_mismatch"
    pre_quote, post_quote = ref.get("pre_observation_quote") or "", ref.get("post_observation_quote") or ""
    if not pre_quote and not post_quote:
        return None, "missing_observation_quote"
    if pre_quote and not _quote_in(pre_quote, pre_observations(source)[step]):
        return None, "observation_quote_mismatch"
    if post_quote and not _quote_in(post_quote, turn.observation):
        return None, "observation_quote_mismatch"
    return EvidenceRef(trajectory_id, step, ref["action_quote"], pre_quote, post_quote), None


def _check_item(raw: Any, group: Sequence[Trajectory], id_counts: Counter) -> tuple[EvidenceItem | None, str | None]:
    if not isinstance(raw, dict):
        return None, "item_not_object"
    if not isinstance(raw.get("id"), str) or not raw["id"].strip():
        return None, "missing_id"
    if id_counts[raw["id"].strip()] > 1:
        return None, "duplicate_id"
    problem = _check_statement(raw.get("statement"))
    if problem:
        return None, problem
    if raw.get("kind") not in ITEM_KINDS:
        return None, "unknown_kind"
    evidence = raw.get("evidence")
    if not isinstance(evidence, list) or not evidence:
        return None, "missing_evidence"
    refs = []
    for ref in evidence:
        checked, problem = _check_reference(ref, group)
        if problem:
            return None, problem
        refs.append(checked)
    return EvidenceItem(raw["id"].strip(), raw["kind"], raw["statement"].strip(), refs), None


def validate_extraction(
    response: dict[str, Any], group: Sequence[Trajectory], max_items: int = DEFAULT_MAX_ITEMS
) -> Validated:
    """Check extracted items against the group's ORIGINAL records; keep the first ``max_items`` that pass.

    Ids must be non-empty and unique: every item sharing a repeated id is rejected, since alignment could not
    tell which one a citation means. One failing reference rejects its whole item.
    """
    result = Validated()
    raw_items = response.get("items")
    if not isinstance(raw_items, list):
        result.rejections["missing_items"] += 1
        return result
    ids = Counter(
        item["id"].strip() for item in raw_items if isinstance(item, dict) and isinstance(item.get("id"), str)
    )
    for raw in raw_items:
        item, problem = _check_item(raw, group, ids)
        if problem:
            result.rejections[problem] += 1
        elif len(result.accepted) >= max_items:
            result.rejections["over_item_limit"] += 1
        else:
            result.accepted.append(item)
    return result


def exclude_target_only(items: Sequence[EvidenceItem], target_id: int) -> list[EvidenceItem]:
    """E_{x,-i} (Section 3.2; A.2, "Candidates must retain support from another successful trajectory"): the
    items another success supports, each with the target's own references removed.

    An item only the target supports is dropped. A co-supported item keeps only its other sources' steps, so
    that what the alignment request shows about sources (``source_actions``) is never the target's own record:
    its own steps enter alignment as the target path H_i, not as evidence that the guidance was followed."""
    out = []
    for item in items:
        others = [ref for ref in item.evidence if ref.trajectory_id != target_id]
        if others:
            out.append(replace(item, evidence=others))
    return out


def target_records(target: Trajectory) -> list[str]:
    """The target's recorded interaction a target quote may come from: task, observations and actions."""
    return [target.task, target.initial_observation] + [
        text for turn in target.turns for text in (turn.action, turn.observation)
    ]


def validate_alignment(
    response: dict[str, Any],
    target_id: int,
    target: Trajectory,
    allowed_ids: Sequence[str],
    max_statements: int | None = DEFAULT_MAX_STATEMENTS,
) -> Validated:
    """Check aligned statements: known target, statement length, allowed evidence ids, a supported target quote.

    Only the first ``max_statements`` statements of the answer (G; None = all) are candidates: A.2 composes
    "accepted statements among the first G candidates", so a rejected candidate leaves its place empty rather
    than letting a later statement in (docs/methods.md). The statements after them are counted as
    ``over_statement_limit``.
    """
    result = Validated()
    # Models often echo the id as a string; anything naming another target is rejected.
    if str(response.get("target_id")) != str(target_id):
        result.rejections["unknown_target"] += 1
        return result
    raw_statements = response.get("statements")
    if not isinstance(raw_statements, list):
        result.rejections["missing_statements"] += 1
        return result
    allowed, records = set(allowed_ids), target_records(target)
    for position, raw in enumerate(raw_statements):
        if max_statements is not None and position >= max_statements:
            result.rejections["over_statement_limit"] += 1
            continue
        statement, problem = _check_aligned(raw, allowed, records)
        if problem:
            result.rejections[problem] += 1
        else:
            result.accepted.append(statement)
    return result


def _check_aligned(raw: Any, allowed: set[str], records: list[str]) -> tuple[AlignedStatement | None, str | None]:
    if not isinstance(raw, dict):
        return None, "statement_not_object"
    problem = _check_statement(raw.get("statement"))
    if problem:
        return None, problem
    problem = _check_evidence_ids(raw.get("evidence_ids"), allowed)
    if problem:
        return None, problem
    if not _quote_in(raw.get("target_quote"), *records):
        return None, "unsupported_target_quote"
    return AlignedStatement(raw["statement"].strip(), [eid.strip() for eid in raw["evidence_ids"]], raw["target_quote"]), None


def validate_step_skills(
    response: dict[str, Any],
    target_id: int,
    target: Trajectory,
    allowed_ids: Sequence[str],
    max_step_skills: int = DEFAULT_MAX_STEP_SKILLS,
) -> Validated:
    """Check step skills: known target, a step of the target, skill length, allowed evidence ids, one per step.

    As for statements, only the first ``max_step_skills`` skills of the answer are candidates (a rejected one
    leaves its place empty); later ones are counted as ``over_step_skill_limit``. A second skill for a step that
    already has one is rejected as ``duplicate_step``: each step is rescored under one skill.
    """
    result = Validated()
    if str(response.get("target_id")) != str(target_id):
        result.rejections["unknown_target"] += 1
        return result
    raw_skills = response.get("step_skills")
    if not isinstance(raw_skills, list):
        result.rejections["missing_step_skills"] += 1
        return result
    allowed, taken = set(allowed_ids), set()
    for position, raw in enumerate(raw_skills):
        if position >= max_step_skills:
            result.rejections["over_step_skill_limit"] += 1
            continue
        skill, problem = _check_step_skill(raw, allowed, len(target.turns))
        if skill is not None and skill.step in taken:
            skill, problem = None, "duplicate_step"
        if problem:
            result.rejections[problem] += 1
        else:
            taken.add(skill.step)
            result.accepted.append(skill)
    return result


def _check_evidence_ids(evidence_ids: Any, allowed: set[str]) -> str | None:
    """Why a statement's or a skill's ``evidence_ids`` are unusable, or None: a non-empty list of allowed ids."""
    if not isinstance(evidence_ids, list) or not evidence_ids:
        return "missing_evidence_ids"
    if not all(isinstance(eid, str) and eid.strip() in allowed for eid in evidence_ids):
        return "unknown_evidence_id"
    return None


def _check_step_skill(raw: Any, allowed: set[str], num_steps: int) -> tuple[StepSkill | None, str | None]:
    if not isinstance(raw, dict):
        return None, "step_skill_not_object"
    step = raw.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < num_steps:
        return None, "invalid_step"
    problem = _check_statement(raw.get("skill"))
    if problem:
        return None, problem
    problem = _check_evidence_ids(raw.get("evidence_ids"), allowed)
    if problem:
        return None, problem
    return StepSkill(step, raw["skill"].strip(), [eid.strip() for eid in raw["evidence_ids"]]), None


# ----------------------------------------------------------------------------------------------- composition


def _count(tokenizer: TokenizerLike, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def _wrap(body: str) -> str:
    return f"{PI_HEADER}\n{body}\n{PI_FOOTER}"


def compose_pi(statements: Sequence[str], tokenizer: TokenizerLike, token_budget: int = DEFAULT_PI_TOKENS) -> str:
    """Compose P_i (A.2, "PI composition and budgeting"); "" when there is nothing to say (no PI).

    The distinct statements become bullets, in order (the G limit applies to the analyzer's candidates,
    ``validate_alignment``). If the wrapper alone takes B_wrapper < B_PI tokens, it encloses the first
    B_PI - B_wrapper guidance tokens; otherwise the first B_PI guidance tokens stand alone. The result never
    exceeds ``token_budget`` tokens once re-tokenised.
    """
    distinct = list(dict.fromkeys(s.strip() for s in statements if s.strip()))
    if not distinct or token_budget <= 0:
        return ""
    body_ids = tokenizer.encode("\n".join(f"- {s}" for s in distinct), add_special_tokens=False)
    wrapper_tokens = _count(tokenizer, _wrap(""))
    wrapped = wrapper_tokens < token_budget
    keep = token_budget - wrapper_tokens if wrapped else token_budget
    # A decoded prefix can re-tokenise into more tokens at the cut or at the wrapper seam, so shrink until it fits.
    while keep > 0:
        body = tokenizer.decode(body_ids[:keep]).strip()
        text = _wrap(body) if wrapped else body
        if body and _count(tokenizer, text) <= token_budget:
            return text
        keep -= 1
    return ""
