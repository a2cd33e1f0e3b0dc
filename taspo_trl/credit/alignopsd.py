"""AlignOPSD credit, stage by stage as the authors' code computes it (``mingju-c/Align-OPSD``, verl-based).

Paper: "Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents". The official trainer
(``BeyondTimestampsRayTrainer``) runs mechanism 1 (decision-aligned rectification) and mechanism 2 (semi-Markov
credit). Each function below is one of its stages, a small pure function on float64 tensors; its docstring names
the official function (file: ``verl/trainer/ppo/thinking_correspondence.py`` for mechanism 1,
``correspondence_credit.py`` for mechanism 2, ``action_consistency.py`` for the filter). docs/methods.md has the
stage table with where this package differs and why.

Matrices over the M turns of one task group (the K sibling rollouts, each rollout's turns in order): the
similarity ``H[source, target]`` is the cosine between the TEACHER's thinking at the source turn (the response
the policy generates under the privileged context) and the STUDENT's thinking at the target turn, and
``B[source, target]`` its structural eligibility. Mechanism 2 reads the same H and B as target-by-source profiles.

Mechanism 1 (for each target turn):
    structural_eligibility      B: same task, another rollout, non-empty thinking on both sides
    select_sources              threshold, one source per sibling rollout, global top-k
    action_consistent_sources   teacher action at the source vs student action at the target (filter after top-k)
    source_log_weights          log omega = log_softmax(s / aggregation temperature); source_weights: omega
    correspondence_confidence   rho = sum omega * clamp((s - tau) / (1 - tau), 0, 1)
    correction_strength         alpha = clamp(alpha_max * rho, 0, alpha_max)
    cross_teacher_logprobs      log sum omega p_k (probability mixture) or sum omega log p_k (log mean)
    corrected_token_gap         ((1 - alpha) log p_diag + alpha log p_cross) - log pi_old (recomputed old log-probs)

Mechanism 2:
    dense_profiles              P[target, :] = softmax over eligible sources of H / profile temperature; valid iff
                                the best eligible source passes tau
    normalized_jsd / cosine_profile_distance / profile_distance
    adjacent_profile_distances  distance into each turn, only between two valid profiles with the same B column
    segmentation_threshold      clip(quantile_0.8(valid distances), 0.01, 0.10); +inf when none is valid
    segment_trajectory          strongest-first boundaries under the min length, then max-length repair
    turn_gap                    mean corrected gap over the turn's policy tokens
    hierarchical_turn_weights   two-level budgets, raw density, box projection, mixing (full method, ablation D)
    flat_turn_weights           ablation C (no spans); flat_token_weights: ablation B (tokens, no mixing)
    project_weighted_box_budget budget-preserving projection onto [lower, upper]
    group_outcome_advantage     GRPO over trajectories or over turn rows ("trajectory" / "turn" scope)
    invalid_action_residual     turn-normalised invalid-action residual added after the credit step

Ablations (official ``algorithm.ablation_mode``): A = no rectification (alpha_max = 0), B = token allocation,
C = flat turn allocation, D = random spans, E = the full method.
"""

from __future__ import annotations

import math
import random
import re
from typing import Hashable, Sequence

import torch

from .tensors import WEIGHT_DTYPE, TensorLike, as_vector

__all__ = [
    "WEIGHT_DTYPE",
    "AGGREGATION_MODES",
    "PROFILE_DISTANCES",
    "SEGMENTATION_MODES",
    "NORMALIZATION_SCOPES",
    "ABLATIONS",
    "structural_eligibility",
    "select_sources",
    "webshop_actions_agree",
    "action_consistent_sources",
    "source_log_weights",
    "source_weights",
    "correspondence_confidence",
    "correction_strength",
    "cross_teacher_logprobs",
    "corrected_token_gap",
    "dense_profiles",
    "normalized_jsd",
    "cosine_profile_distance",
    "profile_distance",
    "adjacent_profile_distances",
    "segmentation_threshold",
    "segment_trajectory",
    "turn_gap",
    "project_weighted_box_budget",
    "mix_density",
    "hierarchical_turn_weights",
    "flat_turn_weights",
    "flat_token_weights",
    "group_outcome_advantage",
    "invalid_action_residual",
]

AGGREGATION_MODES = ("probability_mixture", "log_mean")
PROFILE_DISTANCES = ("jsd", "cosine")
SEGMENTATION_MODES = ("adaptive", "random")
NORMALIZATION_SCOPES = ("trajectory", "turn")
ABLATIONS = ("A", "B", "C", "D", "E")

Span = tuple[int, int]


def _square(matrix: torch.Tensor, name: str, dtype: torch.dtype = WEIGHT_DTYPE) -> torch.Tensor:
    out = torch.as_tensor(matrix).to(dtype)
    if out.dim() != 2 or out.shape[0] != out.shape[1]:
        raise ValueError(f"{name} must be a square [M, M] matrix, got shape {tuple(out.shape)}")
    return out


def _check_threshold(threshold: float) -> float:
    threshold = float(threshold)
    if not -1.0 <= threshold < 1.0:
        raise ValueError(f"similarity threshold must be in [-1, 1), got {threshold!r}")
    return threshold


def _positive(value: float, name: str) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------------------------
# Mechanism 1: decision-aligned supervision rectification


def structural_eligibility(
    rollout_ids: Sequence[Hashable], teacher_thinking_valid: Sequence[bool], student_thinking_valid: Sequence[bool]
) -> torch.Tensor:
    """B[source, target] over the M turns of one task group (official ``build_structural_mask``).

    A source is eligible for a target when it belongs to another rollout and both the teacher's thinking at the
    source and the student's thinking at the target are non-empty (a turn without ``<think>`` content can
    neither give nor receive a match). The official mask also requires the same task (here: one group) and,
    when given, the same data source (one environment per run here).
    """
    teacher = torch.as_tensor(list(teacher_thinking_valid), dtype=torch.bool)
    student = torch.as_tensor(list(student_thinking_valid), dtype=torch.bool)
    m = len(rollout_ids)
    if teacher.shape != (m,) or student.shape != (m,):
        raise ValueError(f"thinking validity must have one entry per turn ({m})")
    codes = {r: k for k, r in enumerate(dict.fromkeys(rollout_ids))}
    rollout = torch.tensor([codes[r] for r in rollout_ids], dtype=torch.long)
    return rollout[:, None].ne(rollout[None, :]) & teacher[:, None] & student[None, :]


def select_sources(
    similarity: torch.Tensor,
    eligible: torch.Tensor,
    rollout_ids: Sequence[Hashable],
    threshold: float = 0.7,
    top_k: int = 3,
) -> list[tuple[int, ...]]:
    """The selected sources of every target (official ``select_sparse_sources``, rollout cap 1).

    For target t: the eligible sources with H[s, t] >= threshold, then each sibling rollout's best one, then the
    ``top_k`` best of those, best first. Ties go to the earlier turn in the group's (rollout, turn) order, which
    is the official tie-break on the sorted turn identity.
    """
    h = _square(similarity, "similarity")
    b = torch.as_tensor(eligible, dtype=torch.bool)
    if b.shape != h.shape or len(rollout_ids) != h.shape[0]:
        raise ValueError("similarity, eligibility and rollout ids must describe the same M turns")
    threshold = _check_threshold(threshold)
    if int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k!r}")
    selected = []
    for target in range(h.shape[1]):
        candidates = [int(s) for s in torch.nonzero(b[:, target] & h[:, target].ge(threshold)).flatten()]
        ranked = sorted(candidates, key=lambda s: (-float(h[s, target]), s))
        best_per_rollout: dict[Hashable, int] = {}
        for source in ranked:
            best_per_rollout.setdefault(rollout_ids[source], source)
        selected.append(tuple(sorted(best_per_rollout.values(), key=lambda s: (-float(h[s, target]), s))[: int(top_k)]))
    return selected


_WEBSHOP_ACTION = re.compile(r"\s*(search|click)\[(.*)\]\s*", re.DOTALL)


def webshop_actions_agree(teacher_action: str, student_action: str) -> bool:
    """WebShop's extra rule of the action filter (official ``action_consistency_mask(webshop=True)``): both
    actions parse as ``search[...]`` / ``click[...]`` with a non-empty argument, the operation is the same, and
    a click's target is identical (after stripping surrounding whitespace; case-sensitive as in the official)."""
    a, b = _WEBSHOP_ACTION.fullmatch(teacher_action), _WEBSHOP_ACTION.fullmatch(student_action)
    if not a or not b or not a[2].strip() or not b[2].strip():
        return False
    return a[1] == b[1] and (a[1] != "click" or a[2].strip() == b[2].strip())


def action_consistent_sources(
    selected: Sequence[Sequence[int]],
    action_similarity: torch.Tensor,
    teacher_actions: Sequence[str],
    student_actions: Sequence[str],
    threshold: float = 0.8,
    webshop: bool = False,
) -> list[tuple[int, ...]]:
    """The action-consistency filter (official ``action_consistency_mask``), applied to the already selected
    sources without replacement: a pair (source, target) is kept when both actions are non-empty, the cosine of
    the teacher's action at the source and the student's action at the target (``action_similarity[source,
    target]``) is finite and >= ``threshold``, and, on WebShop, ``webshop_actions_agree``."""
    sims = _square(action_similarity, "action_similarity")
    threshold = float(threshold)
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"action threshold must be in [-1, 1], got {threshold!r}")

    def keep(source: int, target: int) -> bool:
        teacher, student = teacher_actions[source], student_actions[target]
        if not teacher or not student:
            return False
        value = float(sims[source, target])
        if not (math.isfinite(value) and value >= threshold):
            return False
        return webshop_actions_agree(teacher, student) if webshop else True

    return [tuple(s for s in sources if keep(s, target)) for target, sources in enumerate(selected)]


def source_log_weights(similarities: TensorLike, temperature: float = 0.1) -> torch.Tensor:
    """log omega = log_softmax(s / temperature) over a target's kept sources (official
    ``combine_cross_teacher_scores``, ``aggregation_temperature`` 0.10, which mixes the sources in log space).
    Finite for every source at any temperature: at 1e-5 a similarity 0.01 below the best gives log omega = -1000,
    where exp would underflow to 0. An empty input gives an empty tensor."""
    s = as_vector(similarities, "similarities")
    if s.numel() == 0:
        return s.clone()
    return torch.log_softmax(s / _positive(temperature, "aggregation temperature"), dim=0)


def source_weights(similarities: TensorLike, temperature: float = 0.1) -> torch.Tensor:
    """omega = exp(``source_log_weights``) = softmax(s / temperature) over a target's kept sources (official
    ``combine_cross_teacher_scores``: the weights of rho and of the log-mean mixture). An empty input gives an
    empty tensor."""
    return source_log_weights(similarities, temperature).exp()


def correspondence_confidence(similarities: TensorLike, weights: TensorLike, threshold: float = 0.7) -> float:
    """rho = sum_k omega_k clamp((s_k - tau) / (1 - tau), 0, 1), in [0, 1] (official ``combine_cross_teacher_scores``,
    ``correspondence_confidence``). 0.0 when nothing is kept."""
    s, w = as_vector(similarities, "similarities"), as_vector(weights, "weights")
    if s.shape != w.shape:
        raise ValueError(f"similarities and weights differ in shape: {tuple(s.shape)} vs {tuple(w.shape)}")
    tau = _check_threshold(threshold)
    return float((w * ((s - tau) / (1.0 - tau)).clamp(0.0, 1.0)).sum())


def correction_strength(confidence: float, alpha_max: float = 0.8) -> float:
    """alpha = clamp(alpha_max * rho, 0, alpha_max) (official ``combine_cross_teacher_scores``,
    ``correction_strength``; ablation A sets alpha_max = 0)."""
    alpha_max = float(alpha_max)
    if not 0.0 <= alpha_max <= 1.0:
        raise ValueError(f"alpha_max must be in [0, 1], got {alpha_max!r}")
    return min(max(alpha_max * float(confidence), 0.0), alpha_max)


def cross_teacher_logprobs(
    source_logprobs: torch.Tensor,
    weights: TensorLike,
    mode: str = "probability_mixture",
    log_weights: TensorLike | None = None,
) -> torch.Tensor:
    """The cross-teacher score of the target's response tokens from its k sources (official
    ``combine_cross_teacher_scores``): ``source_logprobs`` [k, L] holds log p_k(y_r), the target's response under
    source k's privileged context.

    ``"probability_mixture"`` (official default): log sum_k omega_k p_k(y_r) = logsumexp_k(log omega_k + log p_k),
    with ``log_weights`` (``source_log_weights``) when given, as the official code mixes; otherwise log(omega),
    which is -inf wherever a weight underflowed to 0.
    ``"log_mean"`` (the Search-3B profile): sum_k omega_k log p_k(y_r).
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"aggregation mode must be one of {AGGREGATION_MODES}, got {mode!r}")
    scores = torch.as_tensor(source_logprobs, dtype=WEIGHT_DTYPE)
    w = as_vector(weights, "weights")
    if scores.dim() != 2 or scores.shape[0] != w.numel() or w.numel() == 0:
        raise ValueError(f"source_logprobs must be [k, L] with k = {w.numel()} >= 1, got {tuple(scores.shape)}")
    if mode == "log_mean":
        return (w[:, None] * scores).sum(dim=0)
    log_w = torch.log(w) if log_weights is None else as_vector(log_weights, "log_weights")
    if log_w.shape != w.shape:
        raise ValueError(f"log_weights must have the shape of weights {tuple(w.shape)}, got {tuple(log_w.shape)}")
    return torch.logsumexp(log_w[:, None] + scores, dim=0)


def corrected_token_gap(
    diagonal_logprobs: TensorLike,
    student_logprobs: TensorLike,
    cross_logprobs: TensorLike | None = None,
    alpha: float = 0.0,
) -> torch.Tensor:
    """g = ((1 - alpha) log p_diag + alpha log p_cross) - log pi_old per response token (official
    ``combine_cross_teacher_scores``, ``corrected_token_gap``).

    log p_diag is the target's response under its own privileged context, log pi_old the old-policy log-probs
    recomputed on the plain context. With no source (``cross_logprobs`` None) or alpha = 0 the gap is the
    diagonal gap exactly.
    """
    diagonal = as_vector(diagonal_logprobs, "diagonal_logprobs")
    student = as_vector(student_logprobs, "student_logprobs")
    if diagonal.shape != student.shape:
        raise ValueError(f"shape mismatch: {tuple(diagonal.shape)} vs {tuple(student.shape)}")
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if cross_logprobs is None or alpha == 0.0:
        return diagonal - student
    cross = as_vector(cross_logprobs, "cross_logprobs")
    if cross.shape != diagonal.shape:
        raise ValueError(f"shape mismatch: {tuple(cross.shape)} vs {tuple(diagonal.shape)}")
    return (1.0 - alpha) * diagonal + alpha * cross - student


# --------------------------------------------------------------------------------------------------------------
# Mechanism 2: correspondence profiles and spans


def dense_profiles(
    similarity: torch.Tensor, eligible: torch.Tensor, threshold: float = 0.7, temperature: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """P[target, source] and its validity (official ``build_dense_correspondence_profiles``).

    Each target's profile is the softmax of H[:, target] / temperature over ALL its eligible sources (the
    threshold truncates nothing); a target with no eligible source has an all-zero row. A profile is valid only
    when it exists and its best eligible similarity is >= the similarity threshold tau.
    """
    h = _square(similarity, "similarity").T
    b = torch.as_tensor(eligible, dtype=torch.bool).T
    if b.shape != h.shape:
        raise ValueError("eligible must have the shape of similarity")
    threshold = _check_threshold(threshold)
    temperature = _positive(temperature, "profile temperature")
    has_source = b.any(dim=1)
    profiles = torch.zeros_like(h)
    valid = torch.zeros(h.shape[0], dtype=torch.bool)
    if bool(has_source.any()):
        logits = (h[has_source] / temperature).masked_fill(~b[has_source], -math.inf)
        profiles[has_source] = torch.softmax(logits, dim=1)
        best = h[has_source].masked_fill(~b[has_source], -math.inf).max(dim=1).values
        valid[has_source] = best.ge(threshold)
    return profiles, valid


def normalized_jsd(left: TensorLike, right: TensorLike) -> float:
    """Jensen-Shannon divergence in bits, i.e. the natural-log JSD / ln 2, in [0, 1] (official
    ``normalized_js_divergence``). Both inputs are probability vectors."""
    p, q = as_vector(left, "left"), as_vector(right, "right")
    if p.shape != q.shape:
        raise ValueError(f"shape mismatch: {tuple(p.shape)} vs {tuple(q.shape)}")
    mid = 0.5 * (p + q)

    def kl_to_mid(x: torch.Tensor) -> torch.Tensor:
        on = x > 0
        return (x[on] * (x[on].log() - mid[on].log())).sum()

    return min(max(float(0.5 * (kl_to_mid(p) + kl_to_mid(q))) / math.log(2.0), 0.0), 1.0)


def cosine_profile_distance(left: TensorLike, right: TensorLike) -> float:
    """1 - cos(p, q) of two probability profiles, in [0, 1] (official ``cosine_profile_distance``)."""
    p, q = as_vector(left, "left"), as_vector(right, "right")
    if p.shape != q.shape:
        raise ValueError(f"shape mismatch: {tuple(p.shape)} vs {tuple(q.shape)}")
    cos = float(torch.nn.functional.cosine_similarity(p[None], q[None], dim=1)[0])
    return min(max(1.0 - cos, 0.0), 1.0)


def profile_distance(left: TensorLike, right: TensorLike, mode: str = "jsd") -> float:
    """The adjacent-profile distance of the configured kind (official ``profile_distance``: ``jsd`` default,
    ``cosine``; the official's third, normalised-entropy distance, is used by no launcher and not provided)."""
    if mode == "jsd":
        return normalized_jsd(left, right)
    if mode == "cosine":
        return cosine_profile_distance(left, right)
    raise ValueError(f"profile distance must be one of {PROFILE_DISTANCES}, got {mode!r}")


def adjacent_profile_distances(
    profiles: torch.Tensor,
    valid: torch.Tensor,
    eligible: torch.Tensor,
    trajectories: Sequence[Sequence[int]],
    mode: str = "jsd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distance into each turn from the previous turn of its trajectory, and whether it counts (official
    ``compute_adjacent_profile_distance``).

    ``trajectories`` lists each rollout's turn indices in turn order. The distance into turn t is computed only
    when both profiles are valid and both turns have the same eligible sources (the same B column), so a change
    of the eligibility mask is never read as a change of decision. Elsewhere the distance is 0 and not valid;
    the first turn of a trajectory has none.
    """
    m = profiles.shape[0]
    distances = torch.zeros(m, dtype=WEIGHT_DTYPE)
    boundary_valid = torch.zeros(m, dtype=torch.bool)
    b = torch.as_tensor(eligible, dtype=torch.bool)
    for rows in trajectories:
        for previous, current in zip(rows[:-1], rows[1:]):
            if bool(valid[previous]) and bool(valid[current]) and torch.equal(b[:, previous], b[:, current]):
                boundary_valid[current] = True
                distances[current] = profile_distance(profiles[previous], profiles[current], mode)
    return distances, boundary_valid


def segmentation_threshold(
    distances: TensorLike, valid: torch.Tensor | Sequence[bool], quantile: float = 0.8, low: float = 0.01, high: float = 0.10
) -> float:
    """The batch's boundary threshold: the ``quantile`` (linear interpolation, ``torch.quantile``) of the valid
    distances, clipped to [low, high]; +inf when no distance is valid (official ``adaptive_segmentation_threshold``)."""
    d = as_vector(distances, "distances")
    keep = torch.as_tensor(valid, dtype=torch.bool)
    if not 0.0 <= float(quantile) <= 1.0 or not 0.0 <= float(low) <= float(high) <= 1.0:
        raise ValueError("need 0 <= quantile <= 1 and 0 <= low <= high <= 1")
    values = d[keep]
    if values.numel() == 0:
        return math.inf
    return min(max(float(torch.quantile(values, float(quantile))), float(low)), float(high))


def _check_segment_lengths(min_turns: int, max_turns: int) -> None:
    if int(min_turns) < 1 or int(max_turns) < 2 * int(min_turns) - 1:
        # Below 2 min - 1 an overlong interval could not always be split into two pieces of at least min turns.
        raise ValueError(f"need min_turns >= 1 and max_turns >= 2 * min_turns - 1, got {min_turns}, {max_turns}")


def segment_trajectory(
    distances: TensorLike,
    boundary_valid: torch.Tensor | Sequence[bool],
    threshold: float,
    min_turns: int = 2,
    max_turns: int = 8,
    fallback_min: float = 0.01,
    mode: str = "adaptive",
    seed: int = 0,
) -> list[Span]:
    """One trajectory's spans, half-open (start, end) turn ranges (official ``segment_trajectories``).

    ``distances[t]`` / ``boundary_valid[t]`` are the distance into turn t and whether it counts.
    1. Candidates (``"adaptive"``): turns t >= 1 with a valid distance > threshold, taken strongest first (ties:
       earlier turn); each is accepted when it leaves at least ``min_turns`` turns to the nearest accepted
       boundary on both sides. ``"random"`` (ablation D): the feasible positions min..T-min in an order shuffled
       by ``random.Random(seed)``, accepted under the same rule.
    2. While some span is longer than ``max_turns``, the leftmost such span is split at its position (leaving at
       least ``min_turns`` on both sides) with the highest valid distance >= ``fallback_min`` (ties: earlier
       turn), or, when there is none, at the feasible position nearest its midpoint (ties: earlier).
    A trajectory shorter than ``min_turns`` is one span.
    """
    _check_segment_lengths(min_turns, max_turns)
    d = as_vector(distances, "distances")
    ok = torch.as_tensor(boundary_valid, dtype=torch.bool)
    T = d.numel()
    if ok.shape != (T,):
        raise ValueError(f"boundary_valid must have {T} entries")
    if mode not in SEGMENTATION_MODES:
        raise ValueError(f"segmentation mode must be one of {SEGMENTATION_MODES}, got {mode!r}")
    if T == 0:
        return []
    lo, hi = int(min_turns), int(max_turns)
    boundaries = {0, T}

    def fits(position: int) -> bool:
        left = max(b for b in boundaries if b < position)
        right = min(b for b in boundaries if b > position)
        return position - left >= lo and right - position >= lo

    if mode == "random":
        candidates = list(range(lo, T - lo + 1))
        random.Random(seed).shuffle(candidates)
    else:
        candidates = [t for t in range(1, T) if bool(ok[t]) and float(d[t]) > float(threshold)]
        candidates.sort(key=lambda t: (-float(d[t]), t))
    for position in candidates:
        if position not in boundaries and fits(position):
            boundaries.add(position)

    while True:
        ordered = sorted(boundaries)
        overlong = next(((a, b) for a, b in zip(ordered[:-1], ordered[1:]) if b - a > hi), None)
        if overlong is None:
            break
        left, right = overlong
        feasible = range(left + lo, right - lo + 1)
        guided = [t for t in feasible if bool(ok[t]) and float(d[t]) >= float(fallback_min)]
        if guided:
            position = min(guided, key=lambda t: (-float(d[t]), t))
        else:
            middle = 0.5 * (left + right)
            position = min(feasible, key=lambda t: (abs(t - middle), t))
        boundaries.add(position)
    ordered = sorted(boundaries)
    return list(zip(ordered[:-1], ordered[1:]))


# --------------------------------------------------------------------------------------------------------------
# Mechanism 2: credit allocation


def turn_gap(gap: TensorLike, mask: torch.Tensor | Sequence[bool] | None = None) -> float:
    """The mean corrected gap over a turn's policy-loss tokens (official ``aggregate_policy_masked_turn_gap``)."""
    g = as_vector(gap, "gap")
    keep = torch.ones_like(g, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    if keep.shape != g.shape or not bool(keep.any()):
        raise ValueError("a turn needs at least one policy-loss token, with a mask shaped like its gap")
    if not bool(torch.isfinite(g[keep]).all()):
        raise ValueError("the corrected gap must be finite")
    return float(g[keep].mean())


def project_weighted_box_budget(
    raw_density: TensorLike, token_counts: TensorLike, upper: float = 4.0, lower: float = 0.0
) -> torch.Tensor:
    """The budget-preserving projection onto the box [lower, upper] (official ``project_weighted_box_budget``).

    The weighted Euclidean projection of the raw density h onto {lower <= x <= upper, sum_t n_t x_t = N} is
    x = clamp(h - lambda, lower, upper) for one shift lambda (its KKT form). The official code finds lambda by
    bisection; here it is solved exactly: f(lambda) = sum_t n_t clamp(h_t - lambda, lower, upper) is continuous,
    nonincreasing and piecewise linear with breakpoints h_t - upper and h_t - lower, so a search over the sorted
    breakpoints finds the piece holding f = N, which is then solved in closed form. A density already inside the
    box is returned as it is; ``upper`` or ``lower`` equal to 1 gives all ones.
    """
    h, n = as_vector(raw_density, "raw_density"), as_vector(token_counts, "token_counts")
    if h.shape != n.shape:
        raise ValueError("raw_density and token_counts must align")
    if not bool(torch.isfinite(h).all()) or bool((h < 0).any()):
        raise ValueError("raw_density must be finite and nonnegative")
    if bool((n <= 0).any()):
        raise ValueError("token_counts must be positive")
    lower, upper = float(lower), float(upper)
    if not (0.0 <= lower <= 1.0 <= upper and math.isfinite(upper)):
        raise ValueError(f"need 0 <= lower <= 1 <= upper < inf, got [{lower}, {upper}]")
    total = float(n.sum())
    if abs(float((n * h).sum()) - total) > 1e-9 * max(total, 1.0):
        raise ValueError("raw density does not conserve the token budget sum_t n_t h_t = N")
    if lower == 1.0 or upper == 1.0:
        return torch.ones_like(h)
    if bool(((h >= lower) & (h <= upper)).all()):
        return h.clone()

    def budget(shift: float) -> float:
        return float((n * (h - shift).clamp(lower, upper)).sum())

    points = torch.unique(torch.cat([h - upper, h - lower]))  # ascending; budget() falls from upper N to lower N
    left, right = 0, points.numel() - 1  # invariant: budget(points[right]) <= N
    while left < right:
        middle = (left + right) // 2
        if budget(float(points[middle])) <= total:
            right = middle
        else:
            left = middle + 1
    end = float(points[right])
    start = float(points[right - 1]) if right > 0 else end - 1.0
    # On (start, end) no coordinate crosses a bound: each is at upper, at lower, or free (h - lambda).
    inside = 0.5 * (start + end)
    at_upper, at_lower = (h - inside) >= upper, (h - inside) <= lower
    free = ~at_upper & ~at_lower
    free_mass = float(n[free].sum())
    fixed = upper * float(n[at_upper].sum()) + lower * float(n[at_lower].sum())
    shift = (float((n[free] * h[free]).sum()) + fixed - total) / free_mass if free_mass > 0 else end
    return (h - shift).clamp(lower, upper)


def mix_density(projected: TensorLike, mixing: float = 0.5) -> torch.Tensor:
    """w = (1 - mixing) + mixing * projected density (official ``compute_correspondence_credit_from_tensors``,
    ``mixing_coefficient`` 0.5): with the box [0, 4] the weights lie in [0.5, 2.5]."""
    mixing = float(mixing)
    if not 0.0 <= mixing <= 1.0:
        raise ValueError(f"mixing coefficient must be in [0, 1], got {mixing!r}")
    return (1.0 - mixing) + mixing * as_vector(projected, "projected")


def _density_box(weighting: str, upper: float, band: float) -> tuple[float, float]:
    """The box of the projected density: [0, upper] (``legacy``, official default) or [1 - band, 1 + band]."""
    if weighting == "legacy":
        return 0.0, float(upper)
    if weighting == "bounded":
        if not 0.0 <= float(band) <= 1.0:
            raise ValueError(f"multiplier band must be in [0, 1], got {band!r}")
        return 1.0 - float(band), 1.0 + float(band)
    raise ValueError(f"weighting mode must be 'legacy' or 'bounded', got {weighting!r}")


def hierarchical_turn_weights(
    scores: TensorLike,
    token_counts: TensorLike,
    spans: Sequence[Span],
    temperature: float = 1.0,
    mixing: float = 0.5,
    upper: float = 4.0,
    weighting: str = "legacy",
    band: float = 0.2,
) -> torch.Tensor:
    """One trajectory's turn weights from its spans (official ``compute_correspondence_credit_from_tensors``).

    ``scores`` are the outcome-aligned turn scores e_t = sign(A) * turn gap, ``token_counts`` n_t > 0.
        span budget       b_s = softmax_s(log N_s + E_s / temp), E_s the mean of e_t over span s, N_s its tokens
        turn budget       q_t = softmax_{t in s}(log n_t + e_t / temp)
        raw density       h_t = N b_s q_t / n_t            (sum_t n_t h_t = N)
        projection        x = project_weighted_box_budget(h, n) onto [0, upper] (or the bounded band)
        weight            w_t = (1 - mixing) + mixing x_t  (sum_t n_t w_t = N)
    All scores equal give exactly ones (h = 1 in exact arithmetic).
    """
    e, n = as_vector(scores, "scores"), as_vector(token_counts, "token_counts")
    if e.shape != n.shape or not bool(torch.isfinite(e).all()):
        raise ValueError("scores must be finite, one per turn with its token count")
    temperature = _positive(temperature, "credit temperature")
    lower, upper = _density_box(weighting, upper, band)
    if e.numel() == 0 or bool((e == e[0]).all()):
        return torch.ones_like(e)
    spans = [(int(a), int(b)) for a, b in spans]
    if [a for a, _ in spans[1:]] != [b for _, b in spans[:-1]] or spans[0][0] != 0 or spans[-1][1] != e.numel():
        raise ValueError(f"spans must partition the {e.numel()} turns, got {spans}")
    span_scores = torch.stack([e[a:b].mean() for a, b in spans])
    span_tokens = torch.stack([n[a:b].sum() for a, b in spans])
    span_budget = torch.softmax(span_tokens.log() + span_scores / temperature, dim=0)
    raw = torch.empty_like(e)
    total = n.sum()
    for k, (a, b) in enumerate(spans):
        within = torch.softmax(n[a:b].log() + e[a:b] / temperature, dim=0)
        raw[a:b] = total * span_budget[k] * within / n[a:b]
    return mix_density(project_weighted_box_budget(raw, n, upper, lower), mixing)


def flat_turn_weights(
    scores: TensorLike,
    token_counts: TensorLike,
    temperature: float = 1.0,
    mixing: float = 0.5,
    upper: float = 4.0,
    weighting: str = "legacy",
    band: float = 0.2,
) -> torch.Tensor:
    """Ablation C, turn allocation without spans (official ``compute_flat_turn_credit``): q = softmax(log n_t +
    e_t / temp) over the trajectory, h_t = N q_t / n_t, then the same projection and mixing. That is
    ``hierarchical_turn_weights`` with the whole trajectory as its one span (b = 1)."""
    n_turns = as_vector(scores, "scores").numel()
    return hierarchical_turn_weights(scores, token_counts, [(0, n_turns)] if n_turns else [], temperature, mixing, upper, weighting, band)


def flat_token_weights(
    token_scores: TensorLike, temperature: float = 1.0, upper: float = 4.0, weighting: str = "legacy", band: float = 0.2
) -> torch.Tensor:
    """Ablation B, allocation over the trajectory's policy tokens (official ``compute_flat_token_credit``):
    q = softmax(sign(A) g_k / temp) over its tokens, h = (number of tokens) q, projected with unit counts. The
    official token ablation applies no mixing: the projected density is the weight."""
    e = as_vector(token_scores, "token_scores")
    if not bool(torch.isfinite(e).all()):
        raise ValueError("token scores must be finite")
    temperature = _positive(temperature, "credit temperature")
    lower, upper = _density_box(weighting, upper, band)
    if e.numel() == 0 or bool((e == e[0]).all()):
        return torch.ones_like(e)
    raw = e.numel() * torch.softmax(e / temperature, dim=0)
    return project_weighted_box_budget(raw, torch.ones_like(e), upper, lower)


# --------------------------------------------------------------------------------------------------------------
# Outcome advantage and the invalid-action residual


def group_outcome_advantage(
    rewards: TensorLike,
    turn_counts: Sequence[int],
    scope: str = "turn",
    epsilon: float = 1e-6,
    scale: bool = True,
) -> torch.Tensor:
    """One task group's GRPO advantage per trajectory (official ``compute_unique_trajectory_grpo_advantage``).

    ``"trajectory"``: mean and unbiased std over the K trajectories' rewards. ``"turn"``: the same statistics
    with each trajectory's reward repeated once per turn, so long trajectories weigh more in mu and sigma; the
    advantage is still one scalar per trajectory, A_i = (R_i - mu) / (sigma + epsilon). Fewer than two
    statistics rows (or ``scale`` off) give no std division; one row gives 0.
    """
    r = as_vector(rewards, "rewards")
    counts = [int(c) for c in turn_counts]
    if len(counts) != r.numel() or any(c < 0 for c in counts):
        raise ValueError("turn_counts must hold one nonnegative count per trajectory")
    if scope not in NORMALIZATION_SCOPES:
        raise ValueError(f"normalization scope must be one of {NORMALIZATION_SCOPES}, got {scope!r}")
    _positive(epsilon, "epsilon")
    statistics = r if scope == "trajectory" else r.repeat_interleave(torch.tensor(counts, dtype=torch.long))
    if statistics.numel() == 0:
        return torch.zeros_like(r)
    centered = r - statistics.mean()
    if not scale or statistics.numel() < 2:
        return centered if statistics.numel() >= 2 else torch.zeros_like(r)
    return centered / (statistics.std() + float(epsilon))


def invalid_action_residual(
    rewards: TensorLike, invalid: Sequence[bool], coefficient: float = 0.1, epsilon: float = 1e-6, scale: bool = True
) -> torch.Tensor:
    """The invalid-action residual of one task group's turn rows (official
    ``compute_invalid_action_advantage_residual``).

    ``rewards`` holds each turn row's episode reward (the trajectory's, repeated over its turns) and ``invalid``
    whether the row's action was invalid. Both the rewards and the penalised rewards R - c * invalid are
    normalised over the group's turn rows (mean, unbiased std, epsilon; one row: mean 0, std 1); the residual is
    their difference. It is added to the token advantages after the credit allocation, so invalid actions never
    enter the profiles, spans or budgets. All actions valid -> exactly 0.
    """
    r = as_vector(rewards, "rewards")
    bad = torch.as_tensor(list(invalid), dtype=torch.bool)
    if bad.shape != r.shape:
        raise ValueError("invalid must have one entry per turn row")
    if float(coefficient) < 0:
        raise ValueError(f"coefficient must be >= 0, got {coefficient!r}")
    _positive(epsilon, "epsilon")
    if not bool(bad.any()) or r.numel() == 0:
        return torch.zeros_like(r)

    def normalise(values: torch.Tensor) -> torch.Tensor:
        # A single row is normalised with mean 0 and std 1, as in the official code.
        centered = values - values.mean() if values.numel() > 1 else values
        spread = values.std() if values.numel() > 1 else torch.ones((), dtype=values.dtype)
        return centered / (spread + float(epsilon)) if scale else centered

    return normalise(r - float(coefficient) * bad.to(r.dtype)) - normalise(r)
