"""Privileged information (PI): what a method's teacher sees and its student does not, for every method that uses it.

- TASPO's P_i: the analyzer protocol (TASPO Section 3.2, Appendix A.2; ``protocol``), its backends
  (``analyzers``: the rule-based one reads with the rules each environment registers in ``taspo_trl.envs``), the
  per-group builder with the Table 2 PI-source ablations (``builder``) and the settings every trainer that builds
  it shares (``context``); OPID's step skills come from the same analyzer.
- The paired rescoring of responses with and without a privileged context (``rescoring``), which the teachers of
  TASPO and the comparison methods share.
- The skill bank and its frozen sentence encoder (``skillbank``, ``encoder``): AlignOPSD's p_x, TASPO's
  ``generic_skill`` source and the skill-conditioned baselines.
- AlignOPSD's privileged side (``alignopsd``): its teachers' skill contexts, the parsed thinking and action of
  each response, each group's correspondence and the cross-teacher views to score; its credit math is
  ``taspo_trl.credit.alignopsd``.

The names below are TASPO's PI, importable from here; the other modules are imported by their path."""

from .analyzers import (
    Analyzer,
    AnalyzerError,
    OpenAICompatibleAnalyzer,
    RuleBasedAnalyzer,
    TransformersAnalyzer,
    reasoning_request_fields,
)
from .builder import (
    PI_SOURCES,
    BatchPI,
    GroupPI,
    PIStats,
    build_batch,
    build_batch_pi,
    build_group_pi,
    render_trajectory_steps,
)
from .protocol import (
    PI_FOOTER,
    PI_HEADER,
    AlignedStatement,
    AnalyzerResponseError,
    EvidenceItem,
    EvidenceRef,
    StepSkill,
    Validated,
    alignment_payload,
    clip_middle,
    compact_trace,
    compose_pi,
    exclude_target_only,
    extraction_payload,
    normalize_whitespace,
    parse_json_object,
    step_skill_payload,
    validate_alignment,
    validate_extraction,
    validate_step_skills,
)

__all__ = [
    "PI_FOOTER",
    "PI_HEADER",
    "PI_SOURCES",
    "AlignedStatement",
    "Analyzer",
    "AnalyzerError",
    "AnalyzerResponseError",
    "BatchPI",
    "EvidenceItem",
    "EvidenceRef",
    "GroupPI",
    "OpenAICompatibleAnalyzer",
    "PIStats",
    "RuleBasedAnalyzer",
    "StepSkill",
    "TransformersAnalyzer",
    "Validated",
    "alignment_payload",
    "build_batch",
    "build_batch_pi",
    "build_group_pi",
    "clip_middle",
    "compact_trace",
    "compose_pi",
    "exclude_target_only",
    "extraction_payload",
    "normalize_whitespace",
    "parse_json_object",
    "reasoning_request_fields",
    "render_trajectory_steps",
    "step_skill_payload",
    "validate_alignment",
    "validate_extraction",
    "validate_step_skills",
]
