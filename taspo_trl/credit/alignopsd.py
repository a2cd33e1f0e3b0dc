"""AlignOPSD credit: decision correspondence, rectified gaps, correspondence spans and bounded allocation.

Paper: "Beyond Timestamps: Decision-Aligned On-Policy Distillation for Long-Horizon Agents" (AlignOPSD).
The extracted paper text lost its formulas; everything below is **this package's reconstruction** of the
method (Sec. 2.2 "Decision-Aligned Supervision Rectification", Sec. 2.3 "Semi-Markov Hierarchical Credit
Assignment") from its prose. Every choice the prose leaves open is a parameter, named in the docstring that
makes it; docs/methods.md summarises the choices and why, and numbers the equations (A1)-(A9) that the
docstrings cite. One small pure function per step, all in float64:

Correspondence (Sec. 2.2, "decision-alignment operator"), for one target turn (i, t) and the candidate source
turns of the OTHER rollouts of the same task (similarities come from a frozen encoder, computed elsewhere):

    correspondence_distribution  c_t: scores normalised over ALL structurally valid sources, before any top-k
    source_weights               W: column weights over the kept sources (sum to 1)
    match_quality                lambda = (sum_j W_j s_j) * k_kept / k, in [0, 1]
    align_turn                   threshold -> one best source per sibling -> top-k -> action-consistency
                                 filter -> (sources, W, lambda, c_t); none kept = identity (lambda = 0)
    align_trajectory             align_turn for every target turn of one trajectory

Rectification (Sec. 2.2, "multi-view supervision rectification"):

    token_gap        g = log pi(y | privileged context) - log pi(y | h_it), per token of the target response y
    rectified_gap    g~ = (1 - lambda) g0 + lambda sum_j W_j g_j (identity, g~ = g0, when nothing was kept)
    rectified_turn_gaps   rectified_gap for every turn of one trajectory

Spans (Sec. 2.3, "correspondence-driven spans"):

    correspondence_shift   D_t = 1 - cos(c_t, c_{t-1})
    correspondence_shifts  D_1 .. D_{T-1} of one trajectory
    adaptive_threshold     batch mean + num_std * std of every D_t in the batch
    segment_spans          boundaries where D_t > threshold, under min/max span length -> contiguous partition
    turn_spans / random_spans   the turn-level and random-span ablations (Table 2)

Evidence and allocation (Sec. 2.3, "outcome-oriented evidence", "hierarchical credit allocation"; App. E):

    turn_evidence / turn_evidences   e_t = sign(A_i) * mean over the turn's optimised tokens of g~
    span_evidence                    E_s = mean of e_t over the turns of span s
    neutral_measure                  beta0_t = n_t / N (the token-proportional, GRPO-neutral credit measure)
    hierarchical_weights             beta_s ~ beta0_s exp(E_s / temp); alpha_t ~ beta0_t exp(e_t / temp) within s;
                                     w_t = beta_s alpha_t / beta0_t  (already sum_t n_t w_t = N)
    bounded_normalize                exact clip-and-rescale: w in [1 - eps, 1 + eps] and sum_t n_t w_t = N
    alignopsd_weights                hierarchical_weights + bounded_normalize (+ the exact GRPO fallback)
    alignopsd_token_weights          the token-level ablation: every token its own unit
    allocation_spans                 spans for the allocation modes "adaptive" | "turn" | "random"
    reweighted_advantages            A~_t = A_i sg(w_t)

Why the allocation has this form: maximising sum_s beta_s E_s - temp KL(beta || beta0) over the simplex gives
beta_s proportional to beta0_s exp(E_s / temp) (the Gibbs form), and the same inside a span for alpha. With all
evidence equal, beta = beta0 and alpha_t = beta0_t / beta0_s, so w_t = 1: the neutral measure is GRPO's uniform
per-token credit. Since sum_t n_t w_t = N sum_s beta_s sum_{t in s} alpha_t = N, the token-weighted mean of
A~ = A w is A before the bounds are imposed; ``bounded_normalize`` restores it exactly after them.

Reconstruction choices (all parameters; defaults noted where they are set):
    * source weights W: proportional to similarity (default; the prose says only "normalized weights") or a
      softmax over similarity / ``weight_temperature``.
    * c_t: softmax over structurally valid sources of similarity / ``profile_temperature`` (default 0.1:
      cosine similarities span at most 2, so temperature 1 would leave c_t almost uniform and D_t uninformative),
      or proportional to max(similarity, 0).
    * the action-consistency filter runs after top-k (default; the prose lists it after "selects the top-k
      matches"), so it can lower coverage k_kept / k; ``action_filter="before_selection"`` applies it as part of
      the eligibility test instead.
    * D between empty correspondence distributions: 0 if both are empty, 1 if exactly one is.
    * span length limits are met exactly by a small dynamic programme (see ``segment_spans``).
    * evidence of a turn with no optimised token, or with no finite gap value, is 0 (no information).
    * bounded normalisation is a multiplicative rescale solved exactly (see ``bounded_normalize``); eps = 0.5.

Units: spans are half-open (start, end) turn ranges; token counts n_t are the optimised (policy-generated,
loss-masked) tokens of turn t. A turn with n_t = 0 carries no credit mass and gets weight exactly 1.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import torch

__all__ = [
    "WEIGHT_DTYPE",
    "DEFAULT_SIMILARITY_THRESHOLD",
    "DEFAULT_TOP_K",
    "DEFAULT_ACTION_THRESHOLD",
    "DEFAULT_PROFILE_TEMPERATURE",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_EPS",
    "ALLOCATION_MODES",
    "TurnCorrespondence",
    "correspondence_distribution",
    "source_weights",
    "match_quality",
    "align_turn",
    "align_trajectory",
    "token_gap",
    "rectified_gap",
    "rectified_turn_gaps",
    "correspondence_shift",
    "correspondence_shifts",
    "adaptive_threshold",
    "segment_spans",
    "turn_spans",
    "random_spans",
    "allocation_spans",
    "turn_evidence",
    "turn_evidences",
    "span_evidence",
    "neutral_measure",
    "hierarchical_weights",
    "bounded_normalize",
    "alignopsd_weights",
    "alignopsd_token_weights",
    "reweighted_advantages",
]

WEIGHT_DTYPE = torch.float64

# Defaults whose values are illegible in the paper (reconstructed: top-k 2, threshold 0.7, temperature 1.0).
DEFAULT_SIMILARITY_THRESHOLD = 0.7
DEFAULT_TOP_K = 2
DEFAULT_ACTION_THRESHOLD = 0.8  # stated in the paper's prose
DEFAULT_PROFILE_TEMPERATURE = 0.1
DEFAULT_TEMPERATURE = 1.0
DEFAULT_EPS = 0.5

ALLOCATION_MODES = ("adaptive", "turn", "token", "random")
_WEIGHTINGS = ("proportional", "softmax")
_PROFILES = ("softmax", "proportional")
_ACTION_FILTERS = ("after_top_k", "before_selection")

TensorLike = torch.Tensor | Sequence[float]
MaskLike = torch.Tensor | Sequence[bool]
Span = tuple[int, int]


# --------------------------------------------------------------------------------------------------------------
# argument helpers


def _vec(values: TensorLike, name: str) -> torch.Tensor:
    out = torch.as_tensor(values, dtype=WEIGHT_DTYPE)
    if out.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(out.shape)}")
    return out


def _mask(values: MaskLike | None, size: int, name: str) -> torch.Tensor | None:
    if values is None:
        return None
    out = torch.as_tensor(values, dtype=torch.bool)
    if out.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {tuple(out.shape)}")
    return out


def _positive_temperature(value: float, name: str, allow_inf: bool = False) -> float:
    value = float(value)
    ok = value > 0 and (math.isfinite(value) or (allow_inf and value == math.inf))
    if not ok:
        raise ValueError(f"{name} must be a {'' if allow_inf else 'finite '}number > 0, got {value!r}")
    return value


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not (0 <= eps < 1):
        # eps >= 1 would allow zero or negative weights, erasing or flipping the advantage sign.
        raise ValueError(f"eps must satisfy 0 <= eps < 1, got {eps!r}")
    return eps


def _check_lengths(min_len: int, max_len: int | None) -> None:
    if int(min_len) < 1:
        raise ValueError(f"min_len must be >= 1, got {min_len!r}")
    if max_len is not None and int(max_len) < 2 * int(min_len) - 1:
        # With max >= 2 min - 1 every T >= min_len splits into spans of allowed length; below it some T cannot
        # (min = max = 3, T = 4), and the partition could not honour both limits.
        raise ValueError(f"max_len must be None or >= 2 * min_len - 1, got min_len={min_len}, max_len={max_len}")


def _counts(token_counts: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(token_counts, torch.Tensor):
        token_counts = token_counts.tolist()
    counts = [int(c) for c in token_counts]
    if any(c < 0 for c in counts):
        raise ValueError(f"token counts must be >= 0, got {counts}")
    return counts


def _advantage_sign(advantage: float | torch.Tensor) -> float:
    value = float(advantage.item() if isinstance(advantage, torch.Tensor) else advantage)
    if not math.isfinite(value):
        raise ValueError(f"advantage must be finite, got {value!r}")
    return 1.0 if value > 0 else (-1.0 if value < 0 else 0.0)


def _check_partition(spans: Sequence[Span], num_turns: int) -> list[Span]:
    out = [(int(s), int(e)) for s, e in spans]
    position = 0
    for s, e in out:
        if s != position or e <= s:
            raise ValueError(f"spans must be a contiguous partition of [0, {num_turns}), got {out}")
        position = e
    if position != num_turns:
        raise ValueError(f"spans must be a contiguous partition of [0, {num_turns}), got {out}")
    return out


# --------------------------------------------------------------------------------------------------------------
# Sec. 2.2: decision correspondence


@dataclass(frozen=True)
class TurnCorrespondence:
    """Correspondence of one target turn (the output of ``align_turn``).

    Attributes:
        sources: kept candidate columns, best similarity first (ties: lower column first). Empty = identity.
        weights: W over ``sources`` (float64, sums to 1 when nonempty; empty otherwise).
        similarities: decision-state cosine of each kept source.
        quality: match quality lambda in [0, 1]; exactly 0.0 when nothing was kept.
        distribution: c_t over ALL candidate columns (0 on structurally invalid ones), before threshold and top-k;
            sums to 1, or is all zeros when no candidate is structurally valid.
        column: W scattered into a dense vector over the candidate columns (the nonzero column of the operator).
    """

    sources: tuple[int, ...]
    weights: torch.Tensor
    similarities: torch.Tensor
    quality: float
    distribution: torch.Tensor
    column: torch.Tensor

    @property
    def is_identity(self) -> bool:
        return len(self.sources) == 0


def correspondence_distribution(
    similarity: TensorLike,
    valid: MaskLike | None = None,
    profile: str = "softmax",
    temperature: float = DEFAULT_PROFILE_TEMPERATURE,
) -> torch.Tensor:
    """(A1) c_t: correspondence scores of one target turn normalised over all structurally valid sources (Sec. 2.3).

    This is taken before the similarity threshold and top-k ("before top-k truncation" in the prose), so it
    describes which sibling contexts the turn resembles even when no single one is a confident match.

    Args:
        similarity: decision-state cosine of the target turn to each candidate source turn, shape (S,).
        valid: structural validity per candidate (None = all valid). Non-finite similarities count as invalid.
        profile: ``"softmax"`` (default): softmax of similarity / temperature over valid sources; or
            ``"proportional"``: max(similarity, 0) normalised (a valid set with no positive score gives zeros).
        temperature: softmax temperature (default 0.1, see the module notes).

    Returns:
        float64 tensor (S,), zero on invalid sources, summing to 1 (or all zeros when nothing is valid).
    """
    if profile not in _PROFILES:
        raise ValueError(f"profile must be one of {_PROFILES}, got {profile!r}")
    sims = _vec(similarity, "similarity")
    ok = torch.isfinite(sims)
    mask = _mask(valid, sims.numel(), "valid")
    if mask is not None:
        ok &= mask
    out = torch.zeros_like(sims)
    if not bool(ok.any()):
        return out
    if profile == "softmax":
        temperature = _positive_temperature(temperature, "temperature")
        out[ok] = torch.softmax(sims[ok] / temperature, dim=0)
    else:
        scores = sims[ok].clamp_min(0.0)
        total = scores.sum()
        if float(total) > 0:
            out[ok] = scores / total
    return out


def source_weights(
    similarities: TensorLike, weighting: str = "proportional", temperature: float = DEFAULT_PROFILE_TEMPERATURE
) -> torch.Tensor:
    """(A2) Column weights W over the kept sources, summing to 1 (Sec. 2.2, "normalized weights"; reconstruction).

    ``weighting="proportional"`` (default): W_j = s_j / sum s (similarities are >= the threshold, hence
    positive at the default 0.7; any non-positive value counts as 0, and if all do, W is uniform).
    ``weighting="softmax"``: W = softmax(s / temperature). An empty input gives an empty tensor.
    """
    if weighting not in _WEIGHTINGS:
        raise ValueError(f"weighting must be one of {_WEIGHTINGS}, got {weighting!r}")
    sims = _vec(similarities, "similarities")
    if sims.numel() == 0:
        return sims.clone()
    if not bool(torch.isfinite(sims).all()):
        raise ValueError("kept source similarities must be finite")
    if weighting == "softmax":
        return torch.softmax(sims / _positive_temperature(temperature, "temperature"), dim=0)
    scores = sims.clamp_min(0.0)
    total = scores.sum()
    if float(total) <= 0:
        return torch.full_like(sims, 1.0 / sims.numel())
    return scores / total


def match_quality(similarities: TensorLike, weights: TensorLike, top_k: int = DEFAULT_TOP_K) -> float:
    """(A2) lambda = clip(sum_j W_j s_j, 0, 1) * k_kept / k: weighted mean similarity times coverage (reconstructed; README, "AlignOPSD").

    0.0 exactly when no source is kept (identity rectification).
    """
    if int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k!r}")
    sims = _vec(similarities, "similarities")
    w = _vec(weights, "weights")
    if sims.shape != w.shape:
        raise ValueError(f"similarities and weights differ in shape: {tuple(sims.shape)} vs {tuple(w.shape)}")
    if sims.numel() == 0:
        return 0.0
    if sims.numel() > int(top_k):
        raise ValueError(f"{sims.numel()} kept sources exceed top_k={top_k}")
    mean_sim = min(max(float((w * sims).sum()), 0.0), 1.0)
    return mean_sim * sims.numel() / int(top_k)


def _rank(indices: list[int], sims: torch.Tensor) -> list[int]:
    # Best similarity first; ties broken by the lower column index (deterministic).
    return sorted(indices, key=lambda j: (-float(sims[j]), j))


def align_turn(
    similarity: TensorLike,
    source_rollout: Sequence[Hashable] | torch.Tensor,
    valid: MaskLike | None = None,
    *,
    action_similarity: TensorLike | None = None,
    actions_parsed: MaskLike | None = None,
    same_operation: MaskLike | None = None,
    same_click_target: MaskLike | None = None,
    target_rollout: Hashable | None = None,
    threshold: float = DEFAULT_SIMILARITY_THRESHOLD,
    top_k: int = DEFAULT_TOP_K,
    action_threshold: float = DEFAULT_ACTION_THRESHOLD,
    weighting: str = "proportional",
    weight_temperature: float = DEFAULT_PROFILE_TEMPERATURE,
    profile: str = "softmax",
    profile_temperature: float = DEFAULT_PROFILE_TEMPERATURE,
    action_filter: str = "after_top_k",
) -> TurnCorrespondence:
    """Decision-alignment operator for one target turn (i, t) (Sec. 2.2; this package's reconstruction).

    Steps, over the candidate source turns (columns) of the other rollouts of the same task:
        1. structural validity: ``valid`` and a finite similarity; columns of ``target_rollout`` (when given)
           are never candidates (a turn is not its own sibling);
        2. drop candidates with similarity < ``threshold`` (a similarity equal to it is kept);
        3. keep at most one candidate per sibling rollout, its best (ties: lower column);
        4. keep the ``top_k`` best of those;
        5. action-consistency filter: both actions parse (``actions_parsed``), action-embedding cosine
           >= ``action_threshold`` (``action_similarity``), and, for WebShop, ``same_operation`` and
           ``same_click_target`` (precomputed masks; the caller sets ``same_click_target`` True when the
           operation is not a click). A ``None`` input skips that check. With ``action_filter="after_top_k"``
           (default) the filter removes kept sources, lowering coverage; ``"before_selection"`` applies it in
           step 1 so a consistent candidate can take the place of an inconsistent better one.
        6. W over what is left (``source_weights``), lambda (``match_quality``).
    Nothing left -> identity: no sources, empty W, lambda = 0.0, zero column.

    Args:
        similarity: decision-state cosine of the target turn to each candidate, shape (S,).
        source_rollout: the sibling rollout id of each candidate column (S,).
        valid: structural validity mask (S,), None = all valid.
        action_similarity, actions_parsed, same_operation, same_click_target: action-consistency inputs (S,).
        target_rollout: the target's own rollout id; its columns are excluded.
        threshold, top_k, action_threshold: the filters (defaults 0.7, 2, 0.8).
        weighting, weight_temperature: see ``source_weights``.
        profile, profile_temperature: see ``correspondence_distribution`` (c_t, over structurally valid columns).
        action_filter: ``"after_top_k"`` (default) or ``"before_selection"``.
    """
    if action_filter not in _ACTION_FILTERS:
        raise ValueError(f"action_filter must be one of {_ACTION_FILTERS}, got {action_filter!r}")
    if int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k!r}")
    sims = _vec(similarity, "similarity")
    size = sims.numel()
    rollouts = source_rollout.tolist() if isinstance(source_rollout, torch.Tensor) else list(source_rollout)
    if len(rollouts) != size:
        raise ValueError(f"source_rollout has {len(rollouts)} entries for {size} candidates")

    structural = _structural_mask(sims, rollouts, valid, target_rollout)
    distribution = correspondence_distribution(sims, structural, profile=profile, temperature=profile_temperature)
    consistent = _consistency_mask(
        size, action_similarity, action_threshold,
        actions_parsed=actions_parsed, same_operation=same_operation, same_click_target=same_click_target,
    )
    eligible = structural & (sims >= float(threshold))
    if action_filter == "before_selection":
        eligible &= consistent
    kept = _best_per_sibling(eligible, sims, rollouts, int(top_k))
    if action_filter == "after_top_k":
        kept = [j for j in kept if bool(consistent[j])]

    kept_sims = sims[kept] if kept else torch.zeros(0, dtype=WEIGHT_DTYPE)
    weights = source_weights(kept_sims, weighting=weighting, temperature=weight_temperature)
    column = torch.zeros(size, dtype=WEIGHT_DTYPE)
    if kept:
        column[kept] = weights
    return TurnCorrespondence(
        sources=tuple(kept),
        weights=weights,
        similarities=kept_sims,
        quality=match_quality(kept_sims, weights, top_k=top_k),
        distribution=distribution,
        column=column,
    )


def _structural_mask(
    sims: torch.Tensor, rollouts: list[Hashable], valid: MaskLike | None, target_rollout: Hashable | None
) -> torch.Tensor:
    """Step 1 of ``align_turn``: valid, finite, and not a column of the target's own rollout."""
    structural = torch.isfinite(sims)
    mask = _mask(valid, sims.numel(), "valid")
    if mask is not None:
        structural &= mask
    if target_rollout is not None:
        structural &= torch.tensor([r != target_rollout for r in rollouts], dtype=torch.bool)
    return structural


def _consistency_mask(
    size: int, action_similarity: TensorLike | None, action_threshold: float, **masks: MaskLike | None
) -> torch.Tensor:
    """Step 5 of ``align_turn``: the columns whose action agrees with the target's on every check given."""
    consistent = torch.ones(size, dtype=torch.bool)
    if action_similarity is not None:
        action_sims = _vec(action_similarity, "action_similarity")
        if action_sims.numel() != size:
            raise ValueError(f"action_similarity must have {size} entries")
        consistent &= torch.isfinite(action_sims) & (action_sims >= float(action_threshold))
    for name, extra in masks.items():
        extra_mask = _mask(extra, size, name)
        if extra_mask is not None:
            consistent &= extra_mask
    return consistent


def _best_per_sibling(eligible: torch.Tensor, sims: torch.Tensor, rollouts: list[Hashable], top_k: int) -> list[int]:
    """Steps 3-4 of ``align_turn``: each sibling's best eligible column, then the ``top_k`` best of those."""
    best_per_rollout: dict[Hashable, int] = {}
    for j in _rank([int(j) for j in torch.nonzero(eligible).flatten().tolist()], sims):
        best_per_rollout.setdefault(rollouts[j], j)  # first seen = best of that sibling
    return _rank(list(best_per_rollout.values()), sims)[:top_k]


def _row(matrix: torch.Tensor | None, t: int, shape: tuple[int, int], name: str):
    if matrix is None:
        return None
    m = torch.as_tensor(matrix)
    if m.dim() == 1:  # the same row for every target turn
        if m.shape != (shape[1],):
            raise ValueError(f"{name} must have shape {shape} or ({shape[1]},), got {tuple(m.shape)}")
        return m
    if tuple(m.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} or ({shape[1]},), got {tuple(m.shape)}")
    return m[t]


def align_trajectory(
    similarity: torch.Tensor,
    source_rollout: Sequence[Hashable] | torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    action_similarity: torch.Tensor | None = None,
    actions_parsed: torch.Tensor | None = None,
    same_operation: torch.Tensor | None = None,
    same_click_target: torch.Tensor | None = None,
    **kwargs,
) -> list[TurnCorrespondence]:
    """``align_turn`` for every target turn of one trajectory.

    ``similarity`` is (T, S): target turns of trajectory i by the candidate source turns of its siblings (the
    same S columns for every t, so the c_t of adjacent turns are comparable). ``source_rollout`` is (S,). Each
    mask / action input is (T, S) or (S,) (shared by all target turns). Other keyword arguments go to
    ``align_turn``. Stack ``[c.distribution for c in result]`` for ``correspondence_shifts``.
    """
    sims = torch.as_tensor(similarity, dtype=WEIGHT_DTYPE)
    if sims.dim() != 2:
        raise ValueError(f"similarity must be (T, S), got shape {tuple(sims.shape)}")
    shape = (int(sims.shape[0]), int(sims.shape[1]))
    return [
        align_turn(
            sims[t],
            source_rollout,
            _row(valid, t, shape, "valid"),
            action_similarity=_row(action_similarity, t, shape, "action_similarity"),
            actions_parsed=_row(actions_parsed, t, shape, "actions_parsed"),
            same_operation=_row(same_operation, t, shape, "same_operation"),
            same_click_target=_row(same_click_target, t, shape, "same_click_target"),
            **kwargs,
        )
        for t in range(shape[0])
    ]


# --------------------------------------------------------------------------------------------------------------
# Sec. 2.2: rectified gap


def token_gap(privileged_logps: TensorLike, plain_logps: TensorLike) -> torch.Tensor:
    """(A3) Per-token gap log pi(y_k | privileged context) - log pi(y_k | h_it) for the target response y.

    The local gap g0 uses the target's own privileged view (p, h_it); an aligned gap g_j uses the source
    history (p, h_jt') with the SAME target response teacher-forced. The plain term is always the target's.
    """
    a = _vec(privileged_logps, "privileged_logps")
    b = _vec(plain_logps, "plain_logps")
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    return a - b


def rectified_gap(
    local_gap: TensorLike,
    aligned_gaps: torch.Tensor | Sequence[TensorLike] | None = None,
    weights: TensorLike | None = None,
    quality: float = 0.0,
) -> torch.Tensor:
    """(A4) g~ = (1 - lambda) g0 + lambda sum_j W_j g_j (Sec. 2.2, multi-view supervision rectification).

    Args:
        local_gap: g0, shape (L,) (one value per token of the target response).
        aligned_gaps: g_j for the kept sources, (k, L) or a sequence of (L,) tensors; None/empty = no source.
        weights: W over the kept sources (k,).
        quality: lambda in [0, 1].

    Returns:
        float64 (L,). Identity (an exact copy of g0) when no source is kept or lambda == 0, even if the aligned
        gaps hold non-finite values (0 * inf would otherwise leak NaN).
    """
    g0 = _vec(local_gap, "local_gap")
    lam = float(quality)
    if not (0.0 <= lam <= 1.0):
        raise ValueError(f"quality must be in [0, 1], got {quality!r}")
    if aligned_gaps is None or len(aligned_gaps) == 0 or lam == 0.0:
        return g0.clone()
    if isinstance(aligned_gaps, torch.Tensor):
        stacked = aligned_gaps.to(WEIGHT_DTYPE)
    else:
        stacked = torch.stack([_vec(g, "aligned_gap") for g in aligned_gaps])
    if stacked.dim() != 2 or stacked.shape[1] != g0.numel():
        raise ValueError(f"aligned_gaps must be (k, {g0.numel()}), got {tuple(stacked.shape)}")
    if weights is None:
        raise ValueError("weights are required with aligned_gaps")
    w = _vec(weights, "weights")
    if w.numel() != stacked.shape[0]:
        raise ValueError(f"{w.numel()} weights for {stacked.shape[0]} aligned gaps")
    return (1.0 - lam) * g0 + lam * (w[:, None] * stacked).sum(dim=0)


def rectified_turn_gaps(
    correspondences: Sequence[TurnCorrespondence],
    local_gaps: Sequence[torch.Tensor | None],
    aligned_gaps: Mapping[tuple[int, int], torch.Tensor] | None,
) -> list[torch.Tensor | None]:
    """(A4) g~ of every turn of one trajectory.

    ``local_gaps`` holds g0 per turn (None: the turn was not scored, and stays None). ``aligned_gaps`` holds g_j
    keyed (turn, source column); None turns rectification off (the ablation: g~ = g0). A turn whose
    correspondence kept no source keeps its g0 (identity).
    """
    out = []
    for t, match in enumerate(correspondences):
        gap = local_gaps[t]
        if gap is not None and aligned_gaps is not None and not match.is_identity:
            gap = rectified_gap(gap, [aligned_gaps[(t, s)] for s in match.sources], match.weights, match.quality)
        out.append(gap)
    return out


# --------------------------------------------------------------------------------------------------------------
# Sec. 2.3: correspondence-driven spans


def correspondence_shift(previous: TensorLike, current: TensorLike) -> float:
    """(A5) D_t = 1 - cos(c_t, c_{t-1}) between adjacent turns' correspondence distributions, in [0, 1].

    Empty (all-zero) distributions, i.e. turns with no structurally valid source: D = 0 when both are empty
    (no evidence of a change), D = 1 when exactly one is (gaining or losing all correspondence is a change).
    Distributions are nonnegative, so the cosine lies in [0, 1]; rounding is clipped back into it.
    """
    p = _vec(previous, "previous")
    q = _vec(current, "current")
    if p.shape != q.shape:
        raise ValueError(f"shape mismatch: {tuple(p.shape)} vs {tuple(q.shape)}")
    if bool((p < 0).any()) or bool((q < 0).any()):
        raise ValueError("correspondence distributions must be nonnegative")
    p_empty, q_empty = not bool(p.any()), not bool(q.any())
    if p_empty and q_empty:
        return 0.0
    if p_empty or q_empty:
        return 1.0
    p, q = p / p.max(), q / q.max()  # cosine is scale-free; this avoids underflow of tiny entries
    cos = float((p * q).sum()) / (float(p.norm()) * float(q.norm()))
    return min(max(1.0 - cos, 0.0), 1.0)


def correspondence_shifts(distributions: torch.Tensor | Sequence[TensorLike]) -> torch.Tensor:
    """[D_1, ..., D_{T-1}] for one trajectory from its c_t rows (T, S); entry b is the shift into turn b + 1.

    A trajectory of T turns has T - 1 shifts (an empty tensor for T <= 1).
    """
    rows = list(distributions) if not isinstance(distributions, torch.Tensor) else list(distributions.unbind(0))
    shifts = [correspondence_shift(rows[t - 1], rows[t]) for t in range(1, len(rows))]
    return torch.tensor(shifts, dtype=WEIGHT_DTYPE)


def adaptive_threshold(shift_lists: Sequence[TensorLike], num_std: float = 1.0) -> float:
    """(A5) Batch-adaptive boundary threshold: mean + num_std * std of all D_t in the batch (reconstructed; README, "AlignOPSD").

    ``shift_lists`` holds one ``correspondence_shifts`` result per trajectory of the batch; the statistics pool
    every finite D_t (population std). No shift at all -> +inf (no boundary anywhere).
    """
    values = [_vec(s, "shifts") for s in shift_lists]
    flat = torch.cat(values) if values else torch.zeros(0, dtype=WEIGHT_DTYPE)
    flat = flat[torch.isfinite(flat)]
    if flat.numel() == 0:
        return math.inf
    return float(flat.mean()) + float(num_std) * float(flat.std(unbiased=False))


def segment_spans(
    shifts: TensorLike,
    threshold: float,
    min_len: int = 1,
    max_len: int | None = None,
    num_turns: int | None = None,
) -> list[Span]:
    """(A5) Contiguous partition of [0, T) with boundaries where D_t > threshold, under span length limits.

    Candidate boundaries are the turns t >= 1 with D_t > threshold (``shifts[t - 1]``). With min_len = 1 and no
    max_len the spans start exactly at the candidates. Under the limits, this package's reconstruction picks,
    among all partitions whose spans have min_len <= length <= max_len, the one that (1) adds the fewest
    boundaries at non-candidate turns, then (2) keeps the most candidate boundaries, then (3) has the largest
    total D over its boundaries (ties: the first found, scanning left to right). A dynamic programme over
    (end position, last span length) finds it exactly in O(T * max_len). max_len >= 2 min_len - 1 guarantees a
    feasible partition for every T >= min_len; a trajectory shorter than min_len is one span.

    Args:
        shifts: [D_1, ..., D_{T-1}] (``correspondence_shifts``). Non-finite values are never candidates.
        threshold: boundary threshold (e.g. ``adaptive_threshold``).
        min_len, max_len: span length limits in turns (max_len None = unbounded).
        num_turns: T, defaults to len(shifts) + 1; pass 0 (with empty shifts) for an empty trajectory.
    """
    _check_lengths(min_len, max_len)
    d = _vec(shifts, "shifts")
    T = d.numel() + 1 if num_turns is None else int(num_turns)
    if T == 0 and d.numel() == 0:
        return []
    if T != d.numel() + 1:
        raise ValueError(f"{d.numel()} shifts do not fit {T} turns (expected T - 1)")
    lo = int(min_len)
    hi = T if max_len is None else min(int(max_len), T)
    if T < lo:
        return [(0, T)]
    finite = torch.isfinite(d)
    cand = [False] + [bool(finite[b]) and float(d[b]) > float(threshold) for b in range(T - 1)]
    gain = [0.0] + [float(d[b]) if bool(finite[b]) else 0.0 for b in range(T - 1)]

    # best[p] = best score of a partition of [0, p) whose last span ends at p; score is a tuple compared
    # lexicographically: (-forced boundaries, candidate boundaries, sum of D at boundaries).
    best: list[tuple[int, int, float] | None] = [None] * (T + 1)
    back = [-1] * (T + 1)
    best[0] = (0, 0, 0.0)
    for p in range(1, T + 1):
        for start in range(max(0, p - hi), p - lo + 1):
            prev = best[start]
            if prev is None:
                continue
            if start == 0:
                score = prev
            else:
                score = (
                    prev[0] - (0 if cand[start] else 1),
                    prev[1] + (1 if cand[start] else 0),
                    prev[2] + gain[start],
                )
            if best[p] is None or score > best[p]:
                best[p], back[p] = score, start
    if best[T] is None:  # unreachable given the checked limits
        raise RuntimeError("no feasible partition")
    spans: list[Span] = []
    end = T
    while end > 0:
        start = back[end]
        spans.append((start, end))
        end = start
    return spans[::-1]


def turn_spans(num_turns: int) -> list[Span]:
    """Turn-level allocation (ablation): every turn its own span."""
    return [(t, t + 1) for t in range(int(num_turns))]


def random_spans(num_turns: int, rng: random.Random, min_len: int = 1, max_len: int | None = None) -> list[Span]:
    """Random contiguous spans for the random-span ablation (Table 2), within the same length limits.

    Left to right, each span length is drawn uniformly (``rng.choice``, a ``random.Random``) among the lengths
    that keep the rest of the trajectory splittable. A trajectory shorter than min_len is one span.
    """
    _check_lengths(min_len, max_len)
    T = int(num_turns)
    if T < 0:
        raise ValueError(f"num_turns must be >= 0, got {num_turns!r}")
    if T == 0:
        return []
    lo = int(min_len)
    if T < lo:
        return [(0, T)]
    hi = T if max_len is None else int(max_len)
    spans: list[Span] = []
    position = 0
    while position < T:
        remaining = T - position
        choices = [n for n in range(lo, min(hi, remaining) + 1) if remaining - n == 0 or remaining - n >= lo]
        n = rng.choice(choices)
        spans.append((position, position + n))
        position += n
    return spans


def allocation_spans(
    mode: str,
    num_turns: int,
    *,
    shifts: TensorLike | None = None,
    threshold: float | None = None,
    rng: random.Random | None = None,
    min_len: int = 1,
    max_len: int | None = None,
) -> list[Span]:
    """Credit units for the turn-level allocation modes (Table 2 ablations).

    ``"adaptive"`` (the method): ``segment_spans(shifts, threshold, ...)``; ``"turn"``: one span per turn;
    ``"random"``: ``random_spans(num_turns, rng, ...)``. ``"token"`` has no turn spans: use
    ``alignopsd_token_weights``.
    """
    if mode == "adaptive":
        if shifts is None or threshold is None:
            raise ValueError("adaptive spans need shifts and threshold")
        return segment_spans(shifts, threshold, min_len=min_len, max_len=max_len, num_turns=num_turns)
    if mode == "turn":
        return turn_spans(num_turns)
    if mode == "random":
        if rng is None:
            raise ValueError("random spans need rng (a random.Random)")
        return random_spans(num_turns, rng, min_len=min_len, max_len=max_len)
    if mode == "token":
        raise ValueError("token-level allocation has no turn spans; use alignopsd_token_weights")
    raise ValueError(f"mode must be one of {ALLOCATION_MODES}, got {mode!r}")


# --------------------------------------------------------------------------------------------------------------
# Sec. 2.3: outcome-oriented evidence


def turn_evidence(rectified: TensorLike, advantage: float | torch.Tensor, mask: MaskLike | None = None) -> float:
    """(A6) e_t = sign(A_i) * mean over the turn's optimised tokens of g~ (Sec. 2.3).

    ``rectified`` is the turn's g~ per token; ``mask`` (optional) selects the optimised tokens. Non-finite
    values are left out of the mean; a turn with no optimised token or no finite value has evidence 0.0 (no
    information, so it stays at the neutral measure). A_i == 0 gives 0.0.
    """
    g = _vec(rectified, "rectified")
    m = _mask(mask, g.numel(), "mask")
    keep = torch.isfinite(g) if m is None else (torch.isfinite(g) & m)
    sign = _advantage_sign(advantage)
    if sign == 0.0 or not bool(keep.any()):
        return 0.0
    return sign * float(g[keep].mean())


def turn_evidences(rectified_per_turn: Sequence[TensorLike | None], advantage: float | torch.Tensor) -> torch.Tensor:
    """``turn_evidence`` for every turn of a trajectory (None = no tokens -> 0); float64 (T,)."""
    return torch.tensor(
        [0.0 if g is None else turn_evidence(g, advantage) for g in rectified_per_turn], dtype=WEIGHT_DTYPE
    )


def span_evidence(
    evidence: TensorLike, spans: Sequence[Span], token_counts: Sequence[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """(A6) E_s = mean of e_t over the turns of span s (Sec. 2.3).

    With ``token_counts``, turns with no optimised token (n_t = 0) are left out (they carry no credit mass); a
    span with none left has E_s = 0.
    """
    e = _vec(evidence, "evidence")
    spans = _check_partition(spans, e.numel())
    counts = None if token_counts is None else _counts(token_counts)
    if counts is not None and len(counts) != e.numel():
        raise ValueError(f"{len(counts)} token counts for {e.numel()} turns")
    span_id = _span_ids(spans, e.numel())
    member = torch.ones_like(e) if counts is None else (torch.tensor(counts, dtype=WEIGHT_DTYPE) > 0).to(e.dtype)
    sums = torch.zeros(len(spans), dtype=WEIGHT_DTYPE).index_add_(0, span_id, e * member)
    sizes = torch.zeros(len(spans), dtype=WEIGHT_DTYPE).index_add_(0, span_id, member)
    return torch.where(sizes > 0, sums / sizes.clamp_min(1.0), torch.zeros_like(sums))


def _span_ids(spans: list[Span], num_turns: int) -> torch.Tensor:
    ids = torch.empty(num_turns, dtype=torch.long)
    for k, (s, t) in enumerate(spans):
        ids[s:t] = k
    return ids


# --------------------------------------------------------------------------------------------------------------
# Sec. 2.3 / App. E: KL-regularised hierarchical allocation and bounded normalisation


def neutral_measure(token_counts: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """(A7) beta0_t = n_t / N: each turn's share of the trajectory's optimised tokens (GRPO's uniform credit).

    All zeros when N = 0.
    """
    counts = torch.tensor(_counts(token_counts), dtype=WEIGHT_DTYPE)
    total = counts.sum()
    return counts / total if float(total) > 0 else counts


def hierarchical_weights(
    evidence: TensorLike,
    token_counts: Sequence[int] | torch.Tensor,
    spans: Sequence[Span],
    temperature: float = DEFAULT_TEMPERATURE,
) -> torch.Tensor:
    """(A7) Raw two-level credit weights w_t = beta_s alpha_t / beta0_t, before the bounds (Sec. 2.3; App. E).

    beta_s is proportional to beta0_s exp(E_s / temp) over spans; alpha_t to beta0_t exp(e_t / temp) within
    span s. Computed in the log domain (stable for any evidence / temperature). Inside one span
    w_t = beta_s exp(e_t / temp) / sum_{u in s} beta0_u exp(e_u / temp), so it increases with e_t and does not
    depend on n_t. sum_t n_t w_t = N (up to rounding). Turns with n_t = 0 get 1.0 and are left out of the
    measure, as are spans made only of such turns. ``temperature = inf`` returns all ones.
    """
    e = _vec(evidence, "evidence")
    counts = _counts(token_counts)
    if len(counts) != e.numel():
        raise ValueError(f"{len(counts)} token counts for {e.numel()} turns")
    spans = _check_partition(spans, e.numel())
    temperature = _positive_temperature(temperature, "temperature", allow_inf=True)
    if not bool(torch.isfinite(e).all()):
        raise ValueError("evidence must be finite")
    w = torch.ones_like(e)
    if temperature == math.inf or sum(counts) == 0:
        return w
    beta0 = neutral_measure(counts)
    live = beta0 > 0
    span_id = _span_ids(spans, e.numel())
    num_spans = len(spans)
    log_beta0 = torch.where(live, torch.log(beta0.clamp_min(1e-300)), torch.zeros_like(beta0))
    # Outer level: beta_s ~ beta0_s exp(E_s / temp) over spans holding tokens.
    beta0_s = torch.zeros(num_spans, dtype=WEIGHT_DTYPE).index_add_(0, span_id, beta0)
    live_s = beta0_s > 0
    outer = torch.full((num_spans,), -math.inf, dtype=WEIGHT_DTYPE)
    outer[live_s] = torch.log(beta0_s[live_s]) + span_evidence(e, spans, counts)[live_s] / temperature
    log_beta = torch.log_softmax(outer, dim=0)
    # Inner level: alpha_t ~ beta0_t exp(e_t / temp) within each span (a per-span log-sum-exp).
    inner = torch.where(live, log_beta0 + e / temperature, torch.full_like(e, -math.inf))
    peak = torch.full((num_spans,), -math.inf, dtype=WEIGHT_DTYPE).scatter_reduce(
        0, span_id, inner, reduce="amax", include_self=True
    )
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    mass = torch.zeros(num_spans, dtype=WEIGHT_DTYPE).index_add_(0, span_id, torch.exp(inner - peak[span_id]))
    log_norm = peak + torch.log(mass.clamp_min(1e-300))
    log_alpha = inner - log_norm[span_id]
    w[live] = torch.exp(log_beta[span_id] + log_alpha - log_beta0)[live]
    return w


def bounded_normalize(
    weights: TensorLike, token_counts: Sequence[int] | torch.Tensor, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """(A8) Bounded normalisation: w' = clip(s * w, 1 - eps, 1 + eps) with the scale s chosen so sum n_t w'_t = N.

    This package's exact form of "clip to [1 - eps, 1 + eps] and rescale so the token-weighted mean is 1".
    Clipping and then rescaling once can leave the bounds again. At a fixed point of "clip, then rescale the
    unclipped turns by a common factor" every unclipped turn is s * w_t for one s and every clipped turn sits at
    its bound, i.e. w' = clip(s * w); so s is solved for directly. f(s) = sum_t n_t clip(s w_t, lo, hi) is
    continuous, nondecreasing and piecewise linear in s with breakpoints lo / w_t and hi / w_t, and
    f(0+) = lo N <= N <= hi N = f(inf). A binary search over the <= 2T sorted breakpoints (f evaluated afresh at
    each probe) finds the linear piece containing f(s) = N, which is then solved in closed form from that piece's
    clipped and free sets. There is no open-ended iteration, so it always terminates, in O(T log T). The result
    meets both the bounds and sum n_t w'_t = N up to float rounding, keeps every weight positive (eps < 1), and
    preserves the order of the raw weights (clip and a positive scale are monotone).

    Args:
        weights: raw positive weights (T,), e.g. ``hierarchical_weights``. Entries of turns with n_t = 0 are
            ignored (their output is 1.0).
        token_counts: n_t (T,).
        eps: bound 0 <= eps < 1 (default 0.5; the paper's value is illegible). eps = 0 gives all ones.
    """
    eps = _check_eps(eps)
    w = _vec(weights, "weights")
    counts = _counts(token_counts)
    if len(counts) != w.numel():
        raise ValueError(f"{len(counts)} token counts for {w.numel()} weights")
    out = torch.ones_like(w)
    live = [t for t, c in enumerate(counts) if c > 0]
    if not live:
        return out
    wl = w[live]
    if not (bool(torch.isfinite(wl).all()) and bool((wl > 0).all())):
        raise ValueError("weights of turns with tokens must be finite and > 0")
    if eps == 0.0 or bool((wl == 1.0).all()):
        return out
    lo, hi = 1.0 - eps, 1.0 + eps
    n = [float(counts[t]) for t in live]
    total = sum(n)
    # Breakpoints of f: at s = lo / w_t turn t leaves the lower bound, at s = hi / w_t it reaches the upper one.
    # f(first breakpoint) = lo N < N and f(last) = hi N >= N. Binary search (f is monotone) for the first
    # breakpoint where f >= N, evaluating f afresh each time: a running slope / intercept updated over a sweep
    # loses everything to cancellation when the raw weights span many orders of magnitude.
    n_t = torch.tensor(n, dtype=WEIGHT_DTYPE)
    lower_at, upper_at = lo / wl, hi / wl
    points = torch.unique(torch.cat([lower_at, upper_at]))  # sorted ascending

    def f(scale_value: float) -> float:
        return float((n_t * (scale_value * wl).clamp(lo, hi)).sum())

    left, right = 0, points.numel() - 1  # invariant: f(points[right]) >= N
    while left < right:
        mid = (left + right) // 2
        if f(float(points[mid])) >= total:
            right = mid
        else:
            left = mid + 1
    position = float(points[right])
    prev = float(points[right - 1]) if right > 0 else 0.0
    # No breakpoint lies strictly inside (prev, position): a turn is lower-clipped there if lo / w_t >= position,
    # upper-clipped if hi / w_t <= prev, and free (s w_t) otherwise. Solve the linear piece for s.
    low = lower_at >= position
    high = (upper_at <= prev) & ~low
    free = ~low & ~high
    fixed = lo * float(n_t[low].sum()) + hi * float(n_t[high].sum())
    free_mass = float((n_t[free] * wl[free]).sum())
    scale = (total - fixed) / free_mass if free_mass > 0 else position
    out[live] = (scale * wl).clamp(lo, hi)
    return out


def alignopsd_weights(
    evidence: TensorLike,
    token_counts: Sequence[int] | torch.Tensor,
    spans: Sequence[Span],
    temperature: float = DEFAULT_TEMPERATURE,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """(A7) + (A8) Per-turn AlignOPSD credit weights (Sec. 2.3; App. E): hierarchical allocation + bounded normalisation.

    Args:
        evidence: e_t per turn (``turn_evidences``).
        token_counts: n_t, optimised tokens per turn.
        spans: credit units: ``segment_spans`` (adaptive, the method), ``turn_spans`` or ``random_spans``.
        temperature: credit temperature (default 1.0; ``inf`` = uniform).
        eps: weight bound (default 0.5).

    Returns:
        float64 (T,) with 1 - eps <= w_t <= 1 + eps, w_t > 0 and sum_t n_t w_t = N, so A~ = A w keeps the sign
        of A and the token-weighted mean advantage. All evidence 0 (no match anywhere with a zero local gap,
        A_i = 0, ...) gives exactly GRPO: every weight is exactly 1.0.
    """
    eps = _check_eps(eps)
    e = _vec(evidence, "evidence")
    if not bool(torch.isfinite(e).all()):
        raise ValueError("evidence must be finite")
    if not bool((e != 0).any()):
        _check_partition(spans, e.numel())
        _positive_temperature(temperature, "temperature", allow_inf=True)
        if len(_counts(token_counts)) != e.numel():
            raise ValueError("one token count per turn is required")
        return torch.ones_like(e)
    raw = hierarchical_weights(e, token_counts, spans, temperature=temperature)
    return bounded_normalize(raw, token_counts, eps=eps)


def alignopsd_token_weights(
    rectified_per_turn: Sequence[TensorLike | None],
    advantage: float | torch.Tensor,
    temperature: float = DEFAULT_TEMPERATURE,
    eps: float = DEFAULT_EPS,
) -> list[torch.Tensor]:
    """Token-level allocation (Table 2 ablation; this package's reconstruction): each token its own unit.

    Token evidence e_k = sign(A_i) g~_k (non-finite -> 0); with every token a span of one token (n = 1), the
    KL form gives w_k = exp(e_k / temp) / mean_k exp(e_k / temp) over all optimised tokens of the trajectory,
    then ``bounded_normalize`` over tokens (bounds, positivity, sum_k w_k = number of tokens). All evidence 0
    -> exactly ones. Returns one float64 tensor per turn (empty for a None turn).
    """
    sign = _advantage_sign(advantage)
    gaps = [torch.zeros(0, dtype=WEIGHT_DTYPE) if g is None else _vec(g, "rectified") for g in rectified_per_turn]
    sizes = [g.numel() for g in gaps]
    flat = torch.cat(gaps) if gaps else torch.zeros(0, dtype=WEIGHT_DTYPE)
    e = torch.where(torch.isfinite(flat), flat, torch.zeros_like(flat)) * sign
    eps = _check_eps(eps)
    temperature = _positive_temperature(temperature, "temperature", allow_inf=True)
    if not bool((e != 0).any()) or temperature == math.inf:
        w = torch.ones_like(e)
    else:
        # hierarchical_weights with one-token spans, in closed form (beta0 = 1/N, alpha = 1):
        # w_k = exp(e_k / temp) / mean exp(e / temp), computed in the log domain.
        logits = e / temperature
        raw = torch.exp(logits - torch.logsumexp(logits, dim=0) + math.log(e.numel()))
        w = bounded_normalize(raw, [1] * e.numel(), eps=eps)
    return [x.clone() for x in torch.split(w, sizes)]


def reweighted_advantages(advantage: float | torch.Tensor, weights: TensorLike) -> torch.Tensor:
    """(A9) A~_t = A_i sg(w_t) (Sec. 2.3): weights are detached; float64 (T,)."""
    a = float(advantage.item() if isinstance(advantage, torch.Tensor) else advantage)
    if not math.isfinite(a):
        raise ValueError(f"advantage must be finite, got {a!r}")
    return a * _vec(torch.as_tensor(weights).detach(), "weights")
