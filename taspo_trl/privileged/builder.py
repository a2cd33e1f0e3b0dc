"""Per-group PI construction: P_i = Compose(Align(E_{x,-i}, x, H_i)) (Section 3.2, Eq. 2; Algorithm 1 lines 5-9).

For each task group (K sibling rollouts): one extraction over the verified successes, then for every target
(successful ones too) exclusion of items only it supports, one alignment call on its full recorded history,
validation, and composition. A group without a verified success gets no PI (Algorithm 1: GRPO fallback).
Any analyzer failure (error, timeout, unparsable or rejected answer) only empties the PI it concerned: it is
logged and counted, never raised.

Table 2's PI-source ablations, and the comparison methods' sources, share the same composition and budget:
  ``aligned``          the full pipeline above (TASPO);
  ``success_skills``   the extracted items another success supports (exclusion as for ``aligned``), composed
                       without alignment: skills summarised from the agent's own successes (Skill-SD's teacher);
  ``nearest_success``  the successful sibling whose actions overlap the target's most (Jaccard similarity of
                       the sets of lower-cased action words; ties go to the lowest index), rendered step by step;
  ``random_success``   a successful sibling drawn with a seeded RNG (seed, group, target), rendered alike;
  ``generic_skill``    the caller's task-type skill text, ``skill_lookup(task, task_type) -> str``.
The trajectory sources never use the target itself (as exclusion does for ``aligned``); the generic skill
needs no success, since it does not come from the group.

Step skills (OPID), asked for with ``max_step_skills`` > 0 on top of any source: after the same extraction and
exclusion, one request per target for at most that many skills, each tied to one of the target's steps,
validated (``validate_step_skills``) and composed one by one, so that each is the privileged context of its step.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from .analyzers import Analyzer, AnalyzerError
from .protocol import (
    DEFAULT_CHAR_BUDGET,
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_STATEMENTS,
    DEFAULT_PI_TOKENS,
    AlignedStatement,
    AnalyzerResponseError,
    EvidenceItem,
    TokenizerLike,
    alignment_messages,
    alignment_payload,
    clip_middle,
    compose_pi,
    exclude_target_only,
    extraction_messages,
    extraction_payload,
    normalize_whitespace,
    parse_json_object,
    step_skill_messages,
    step_skill_payload,
    validate_alignment,
    validate_extraction,
    validate_step_skills,
)

if TYPE_CHECKING:
    from ..rollout.records import Trajectory

logger = logging.getLogger(__name__)

PI_SOURCES = ("aligned", "nearest_success", "random_success", "generic_skill", "success_skills")
ANALYZER_SOURCES = ("aligned", "success_skills")
SkillLookup = Callable[[str, "str | None"], str]
_RENDERED_OBSERVATION_CHARS = 100


@dataclass
class PIStats:
    """Counters of one PI construction (a group or a merged batch); ``coverage`` = share of trajectories with PI."""

    trajectories: int = 0
    with_pi: int = 0
    groups: int = 0
    analyzer_calls: int = 0
    analyzer_errors: int = 0
    analyzer_seconds: float = 0.0
    cache_hits: int = 0
    accepted_items: int = 0
    aligned_statements: int = 0
    step_skills: int = 0
    """Step skills composed (OPID); their rejections are counted under ``step_skills/<reason>``."""
    with_step_skills: int = 0
    """Trajectories that got at least one step skill."""
    rejections: Counter = field(default_factory=Counter)
    """Rejected responses, items and statements, by reason (``analyzer_error``, ``duplicate_id``, ...)."""
    fallbacks: Counter = field(default_factory=Counter)
    """Trajectories left without PI, by reason (``no_success``, ``extraction_failed``, ...)."""

    @property
    def coverage(self) -> float:
        return self.with_pi / self.trajectories if self.trajectories else 0.0

    def merge(self, other: PIStats) -> PIStats:
        """A new PIStats adding ``other``'s counts to this one's."""
        merged = PIStats()
        for f in fields(self):
            setattr(merged, f.name, getattr(self, f.name) + getattr(other, f.name))
        return merged

    def as_metrics(self, prefix: str = "pi/") -> dict[str, float]:
        """Flat numbers for a trainer's metric log."""
        metrics = {
            f"{prefix}{f.name}": float(getattr(self, f.name))
            for f in fields(self)
            if f.name not in ("rejections", "fallbacks")
        }
        metrics[f"{prefix}coverage"] = self.coverage
        metrics.update({f"{prefix}rejected/{k}": float(v) for k, v in sorted(self.rejections.items())})
        metrics.update({f"{prefix}fallback/{k}": float(v) for k, v in sorted(self.fallbacks.items())})
        return metrics


@dataclass
class GroupPI:
    """The PI of one task group: one text per trajectory ("" = no PI), what it was built from, and counters."""

    texts: list[str]
    items: list[EvidenceItem]
    """Validated extracted items E_x (``aligned`` source only)."""
    statements: list[list[AlignedStatement]]
    """Accepted aligned statements per target, before composition (``aligned`` source only)."""
    stats: PIStats
    step_skills: list[dict[int, str]] = field(default_factory=list)
    """Per target, its composed step skills by step index (empty unless step skills were asked for)."""


@dataclass
class BatchPI:
    """The PI of a batch, one entry per input trajectory, and the merged counters."""

    texts: list[str]
    step_skills: list[dict[int, str]]
    stats: PIStats


@dataclass(frozen=True)
class _Settings:
    source: str
    tokenizer: Any
    char_budget: int
    max_items: int
    max_statements: int
    token_budget: int
    skill_lookup: SkillLookup | None
    seed: int
    max_step_skills: int = 0

    def check(self, analyzer: Analyzer | None) -> None:
        if self.source not in PI_SOURCES:
            raise ValueError(f"unknown PI source {self.source!r}; choose one of {', '.join(PI_SOURCES)}")
        if self.source in ANALYZER_SOURCES and analyzer is None:
            raise ValueError(f"the {self.source!r} PI source needs an analyzer (e.g. RuleBasedAnalyzer())")
        if self.max_step_skills < 0:
            raise ValueError(f"max_step_skills must be >= 0, got {self.max_step_skills}")
        if self.max_step_skills and analyzer is None:
            raise ValueError("step skills are written by an analyzer: pass one (e.g. RuleBasedAnalyzer())")
        if self.source == "generic_skill" and self.skill_lookup is None:
            raise ValueError("the 'generic_skill' PI source needs skill_lookup(task, task_type) -> str")


def build_group_pi(
    trajectories: Sequence[Trajectory],
    analyzer: Analyzer | None,
    tokenizer: TokenizerLike,
    source: str = "aligned",
    *,
    char_budget: int = DEFAULT_CHAR_BUDGET,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_statements: int = DEFAULT_MAX_STATEMENTS,
    token_budget: int = DEFAULT_PI_TOKENS,
    skill_lookup: SkillLookup | None = None,
    max_step_skills: int = 0,
    seed: int = 0,
) -> GroupPI:
    """The PI of every trajectory of one task group (the K siblings), in input order (Eq. 2, Table 2 sources),
    and its step skills when ``max_step_skills`` > 0 (OPID's default is ``DEFAULT_MAX_STEP_SKILLS``)."""
    settings = _Settings(
        source, tokenizer, char_budget, max_items, max_statements, token_budget, skill_lookup, seed, max_step_skills
    )
    settings.check(analyzer)
    hits_before = getattr(analyzer, "cache_hits", 0)
    result = _build_groups([list(trajectories)], analyzer, settings)[0]
    result.stats.cache_hits = getattr(analyzer, "cache_hits", 0) - hits_before
    return result


def build_batch(
    trajectories: Sequence[Trajectory],
    group_size: int,
    analyzer: Analyzer | None,
    tokenizer: TokenizerLike,
    source: str = "aligned",
    *,
    char_budget: int = DEFAULT_CHAR_BUDGET,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_statements: int = DEFAULT_MAX_STATEMENTS,
    token_budget: int = DEFAULT_PI_TOKENS,
    skill_lookup: SkillLookup | None = None,
    max_step_skills: int = 0,
    seed: int = 0,
) -> BatchPI:
    """PI (and step skills when ``max_step_skills`` > 0) for a batch whose groups are consecutive blocks of
    ``group_size`` siblings (TRL's repeated prompts).

    Analyzer calls of all groups run concurrently on ``analyzer.workers`` threads (all extractions, then all
    per-target requests); results are placed by position, so the output depends only on the inputs and the
    analyzer's answers.
    """
    settings = _Settings(
        source, tokenizer, char_budget, max_items, max_statements, token_budget, skill_lookup, seed, max_step_skills
    )
    settings.check(analyzer)
    groups = _split_groups(trajectories, group_size)
    hits_before = getattr(analyzer, "cache_hits", 0)
    results = _build_groups(groups, analyzer, settings)
    stats = PIStats()
    for result in results:
        stats = stats.merge(result.stats)
    stats.cache_hits = getattr(analyzer, "cache_hits", 0) - hits_before
    return BatchPI(
        [text for result in results for text in result.texts],
        [skills for result in results for skills in result.step_skills],
        stats,
    )


def build_batch_pi(
    trajectories: Sequence[Trajectory],
    group_size: int,
    analyzer: Analyzer | None,
    tokenizer: TokenizerLike,
    source: str = "aligned",
    **options: Any,
) -> tuple[list[str], PIStats]:
    """One PI string per input trajectory and the merged stats (``build_batch`` without step skills; ``options``
    are its keyword arguments)."""
    result = build_batch(trajectories, group_size, analyzer, tokenizer, source, **options)
    return result.texts, result.stats


def _split_groups(trajectories: Sequence[Trajectory], group_size: int) -> list[list[Trajectory]]:
    if group_size < 1 or len(trajectories) % group_size:
        raise ValueError(f"{len(trajectories)} trajectories do not split into groups of {group_size}")
    groups = [list(trajectories[start : start + group_size]) for start in range(0, len(trajectories), group_size)]
    for index, group in enumerate(groups):
        if len({t.group for t in group}) > 1:
            raise ValueError(
                f"block {index} mixes task groups {sorted({t.group for t in group})}; siblings must be consecutive"
            )
    return groups


def _build_groups(groups: list[list[Trajectory]], analyzer: Analyzer | None, settings: _Settings) -> list[GroupPI]:
    if settings.source not in ANALYZER_SOURCES and not settings.max_step_skills:
        return [_with_step_skills(_ablation_group(g, group, settings), []) for g, group in enumerate(groups)]
    per_target = {"aligned": _align, "success_skills": _success_skills}.get(settings.source)
    jobs = [(g, i) for g, group in enumerate(groups) for i in range(len(group))]
    with ThreadPoolExecutor(max_workers=max(1, getattr(analyzer, "workers", 1))) as pool:
        extracted = list(pool.map(lambda group: _extract(group, analyzer, settings), groups))

        def run(stage: Callable) -> list[Any]:
            """``stage`` of every target, in job order."""
            return list(pool.map(lambda job: stage(groups[job[0]], job[1], extracted[job[0]], analyzer, settings), jobs))

        targets = run(per_target) if per_target else []
        steps = run(_step_skills) if settings.max_step_skills else []
    results = []
    for g, group in enumerate(groups):
        mine = [k for k, (h, _) in enumerate(jobs) if h == g]
        if per_target:
            result = _collect(extracted[g], [targets[k] for k in mine])
        else:  # a source that needs no analyzer, asked for step skills: count the extraction, not its group twice
            result = _ablation_group(g, group, settings)
            result.stats = result.stats.merge(replace(extracted[g].stats, groups=0))
        results.append(_with_step_skills(result, [steps[k] for k in mine] if steps else []))
    return results


def _with_step_skills(result: GroupPI, steps: list[tuple[dict[int, str], PIStats]]) -> GroupPI:
    """``result`` with its targets' step skills (none when ``steps`` is empty) and their counters."""
    result.step_skills = [skills for skills, _ in steps] or [{} for _ in result.texts]
    for _, stats in steps:
        result.stats = result.stats.merge(stats)
    return result


@dataclass
class _Extraction:
    items: list[EvidenceItem]
    failure: str | None
    stats: PIStats


def _call(analyzer: Analyzer, messages: list[dict[str, str]], stats: PIStats, what: str) -> dict[str, Any] | None:
    """One analyzer request, parsed; any failure is logged, counted in ``stats`` and returned as None."""
    stats.analyzer_calls += 1
    start = time.perf_counter()
    try:
        text = analyzer.complete(messages)
        if not isinstance(text, str):  # e.g. a custom analyzer, or a cache another tool wrote
            raise AnalyzerError(f"the analyzer answered with a {type(text).__name__}, not text")
    # The trainer must never die on an analyzer: the target just gets no PI.
    except Exception as error:  # noqa: BLE001
        stats.analyzer_errors += 1
        stats.rejections["analyzer_error"] += 1
        logger.warning("%s: analyzer failed (%s: %s); no PI from it", what, type(error).__name__, error)
        return None
    finally:
        stats.analyzer_seconds += time.perf_counter() - start
    try:
        return parse_json_object(text)
    except AnalyzerResponseError as error:
        stats.rejections[error.reason] += 1
        logger.warning("%s: analyzer answer rejected (%s); no PI from it", what, error)
        return None


def _extract(group: list[Trajectory], analyzer: Analyzer, settings: _Settings) -> _Extraction:
    """E_x from the group's verified successes (Algorithm 1, line 5)."""
    stats = PIStats(groups=1)
    successes = {index: t for index, t in enumerate(group) if t.won}
    if not successes:
        return _Extraction([], "no_success", stats)
    payload = extraction_payload(successes, settings.char_budget, settings.max_items)
    response = _call(analyzer, extraction_messages(payload), stats, f"extraction for task {group[0].task!r}")
    if response is None:
        return _Extraction([], "extraction_failed", stats)
    validated = validate_extraction(response, group, settings.max_items)
    stats.rejections.update(validated.rejections)
    stats.accepted_items += len(validated.accepted)
    return _Extraction(validated.accepted, None if validated.accepted else "no_valid_items", stats)


def _items_for_target(extraction: _Extraction, target_id: int, stats: PIStats) -> list[EvidenceItem]:
    """The extracted items a target may be given (those another success supports), counting why there are none."""
    if extraction.failure:
        stats.fallbacks[extraction.failure] += 1
        return []
    allowed = exclude_target_only(extraction.items, target_id)
    if not allowed:
        stats.fallbacks["no_items_after_exclusion"] += 1
    return allowed


def _align(
    group: list[Trajectory], target_id: int, extraction: _Extraction, analyzer: Analyzer, settings: _Settings
) -> tuple[str, list[AlignedStatement], PIStats]:
    """P_i for one target: exclusion, alignment, validation, composition (Algorithm 1, lines 8-9)."""
    stats = PIStats(trajectories=1)
    allowed = _items_for_target(extraction, target_id, stats)
    if not allowed:
        return "", [], stats
    target = group[target_id]
    payload = alignment_payload(target_id, target, allowed, settings.char_budget)
    response = _call(
        analyzer, alignment_messages(payload), stats, f"alignment of target {target_id} for task {target.task!r}"
    )
    if response is None:
        stats.fallbacks["alignment_failed"] += 1
        return "", [], stats
    validated = validate_alignment(response, target_id, target, [item.id for item in allowed], settings.max_statements)
    stats.rejections.update(validated.rejections)
    stats.aligned_statements += len(validated.accepted)
    text = compose_pi([s.statement for s in validated.accepted], settings.tokenizer, settings.token_budget)
    _count_outcome(stats, text, "no_aligned_statements")
    return text, validated.accepted, stats


def _success_skills(
    group: list[Trajectory], target_id: int, extraction: _Extraction, analyzer: Analyzer, settings: _Settings
) -> tuple[str, list[AlignedStatement], PIStats]:
    """Skills summarised from the group's successes for one target: the extracted items another success supports,
    in the analyzer's order, composed without alignment (the ``success_skills`` source; no analyzer call here)."""
    stats = PIStats(trajectories=1)
    allowed = _items_for_target(extraction, target_id, stats)
    if not allowed:
        return "", [], stats
    text = compose_pi([item.statement for item in allowed], settings.tokenizer, settings.token_budget)
    _count_outcome(stats, text, "empty_skills")
    return text, [], stats


def _step_skills(
    group: list[Trajectory], target_id: int, extraction: _Extraction, analyzer: Analyzer, settings: _Settings
) -> tuple[dict[int, str], PIStats]:
    """OPID's step skills for one target, by step index, each composed alone as the privileged context of its step."""
    stats = PIStats()
    if extraction.failure:
        return {}, stats
    allowed = exclude_target_only(extraction.items, target_id)
    if not allowed:
        return {}, stats
    target = group[target_id]
    payload = step_skill_payload(target_id, target, allowed, settings.char_budget, settings.max_step_skills)
    response = _call(
        analyzer, step_skill_messages(payload), stats, f"step skills of target {target_id} for task {target.task!r}"
    )
    if response is None:
        return {}, stats
    validated = validate_step_skills(
        response, target_id, target, [item.id for item in allowed], settings.max_step_skills
    )
    stats.rejections.update({f"step_skills/{reason}": n for reason, n in validated.rejections.items()})
    composed = {s.step: compose_pi([s.skill], settings.tokenizer, settings.token_budget) for s in validated.accepted}
    skills = {step: text for step, text in composed.items() if text}
    stats.step_skills += len(skills)
    stats.with_step_skills += int(bool(skills))
    return skills, stats


def _collect(extraction: _Extraction, targets: list[tuple[str, list[AlignedStatement], PIStats]]) -> GroupPI:
    stats = extraction.stats
    for _, _, target_stats in targets:
        stats = stats.merge(target_stats)
    return GroupPI([t[0] for t in targets], extraction.items, [t[1] for t in targets], stats)


def _count_outcome(stats: PIStats, text: str, empty_reason: str) -> None:
    if text:
        stats.with_pi += 1
    else:
        stats.fallbacks[empty_reason] += 1


# ----------------------------------------------------------------------------------------------- Table 2 ablations


def _ablation_group(group_index: int, group: list[Trajectory], settings: _Settings) -> GroupPI:
    stats = PIStats(groups=1)
    texts = []
    for target_id in range(len(group)):
        statements, empty_reason = _ablation_statements(group_index, group, target_id, settings)
        text = compose_pi(statements, settings.tokenizer, settings.token_budget)
        stats.trajectories += 1
        _count_outcome(stats, text, empty_reason)
        texts.append(text)
    return GroupPI(texts, [], [[] for _ in group], stats)


def _ablation_statements(
    group_index: int, group: list[Trajectory], target_id: int, settings: _Settings
) -> tuple[list[str], str]:
    """The bullet lines of one ablation source for one target, and the reason to give if there are none."""
    target = group[target_id]
    if settings.source == "generic_skill":
        try:
            skill = settings.skill_lookup(target.task, target.task_type) or ""
        except Exception as error:  # noqa: BLE001 - a failing lookup costs this target its PI, not the run
            logger.warning("skill_lookup failed for task %r (%s: %s); no PI", target.task, type(error).__name__, error)
            return [], "skill_lookup_failed"
        return [line.strip().lstrip("-*• ").strip() for line in skill.splitlines()], "no_skill"
    others = [index for index, t in enumerate(group) if t.won and index != target_id]
    if not others:
        return [], "no_success" if not any(t.won for t in group) else "no_other_success"
    if settings.source == "nearest_success":
        words = _action_words(target)
        chosen = max(others, key=lambda index: (_jaccard(words, _action_words(group[index])), -index))
    else:
        chosen = random.Random(f"{settings.seed}:{group_index}:{target_id}").choice(others)
    return render_trajectory_steps(group[chosen]), "empty_success"


def _action_words(trajectory: Trajectory) -> set[str]:
    return {word for turn in trajectory.turns for word in turn.action.lower().split()}


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def render_trajectory_steps(trajectory: Trajectory) -> list[str]:
    """A successful trajectory as numbered "action -> observation" lines (the reuse ablations' PI)."""
    lines = []
    for t, turn in enumerate(trajectory.turns):
        observation = clip_middle(normalize_whitespace(turn.observation), _RENDERED_OBSERVATION_CHARS)
        lines.append(f"step {t + 1}: {normalize_whitespace(turn.action)} -> {observation}")
    return lines
