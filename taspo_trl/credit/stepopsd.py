"""Bounded Gibbs credit allocation over contiguous spans of turns (StepOPSD's budget, ``credit/baselines.py``).

This is the allocation the AlignOPSD reconstruction used before the official AlignOPSD code was public; the
official AlignOPSD allocation now lives in ``credit/alignopsd.py``. StepOPSD's approximation keeps this one: each
unit's budget follows the Gibbs form beta_s ~ beta0_s exp(E_s / temp) (the maximiser of sum_s beta_s E_s -
temp KL(beta || beta0), beta0 the token-proportional measure), and the weights are clipped to [1 - eps, 1 + eps]
and rescaled exactly so the token-weighted mean advantage is kept.

    turn_evidence        e_t = sign(A) * mean over the unit's masked tokens of the gap
    span_evidence        E_s = mean of e_t over the turns of span s
    neutral_measure      beta0_t = n_t / N
    hierarchical_weights w_t = beta_s alpha_t / beta0_t (sum_t n_t w_t = N)
    bounded_normalize    w' = clip(s w, 1 - eps, 1 + eps) with sum_t n_t w'_t = N, solved exactly
    gibbs_weights    hierarchical_weights + bounded_normalize (all evidence 0 -> exactly ones)
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .tensors import WEIGHT_DTYPE, TensorLike, as_vector

__all__ = ["turn_evidence", "span_evidence", "neutral_measure", "hierarchical_weights", "bounded_normalize", "gibbs_weights"]

DEFAULT_TEMPERATURE = 1.0
DEFAULT_EPS = 0.5

MaskLike = torch.Tensor | Sequence[bool]
Span = tuple[int, int]

def _mask(values: MaskLike | None, size: int, name: str) -> torch.Tensor | None:
    if values is None:
        return None
    out = torch.as_tensor(values, dtype=torch.bool)
    if out.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {tuple(out.shape)}")
    return out


def _positive_temperature(value: float) -> float:
    # +inf is allowed: it turns the allocation off (all weights 1).
    value = float(value)
    if not value > 0:
        raise ValueError(f"temperature must be a number > 0, got {value!r}")
    return value


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not (0 <= eps < 1):
        # eps >= 1 would allow zero or negative weights, erasing or flipping the advantage sign.
        raise ValueError(f"eps must satisfy 0 <= eps < 1, got {eps!r}")
    return eps


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


def turn_evidence(rectified: TensorLike, advantage: float | torch.Tensor, mask: MaskLike | None = None) -> float:
    """e_t = sign(A_i) * mean over the turn's optimised tokens of g~.

    ``rectified`` is the turn's g~ per token; ``mask`` (optional) selects the optimised tokens. Non-finite
    values are left out of the mean; a turn with no optimised token or no finite value has evidence 0.0 (no
    information, so it stays at the neutral measure). A_i == 0 gives 0.0.
    """
    g = as_vector(rectified, "rectified")
    m = _mask(mask, g.numel(), "mask")
    keep = torch.isfinite(g) if m is None else (torch.isfinite(g) & m)
    sign = _advantage_sign(advantage)
    if sign == 0.0 or not bool(keep.any()):
        return 0.0
    return sign * float(g[keep].mean())


def span_evidence(
    evidence: TensorLike, spans: Sequence[Span], token_counts: Sequence[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """E_s = mean of e_t over the turns of span s.

    With ``token_counts``, turns with no optimised token (n_t = 0) are left out (they carry no credit mass); a
    span with none left has E_s = 0.
    """
    e = as_vector(evidence, "evidence")
    spans = _check_partition(spans, e.numel())
    counts = None if token_counts is None else _counts(token_counts)
    if counts is not None and len(counts) != e.numel():
        raise ValueError(f"{len(counts)} token counts for {e.numel()} turns")
    span_id = _span_ids(spans, e.numel())
    member = torch.ones_like(e) if counts is None else (torch.tensor(counts, dtype=WEIGHT_DTYPE) > 0).to(e.dtype)
    # where, not e * member: a left-out turn's placeholder may be NaN, and NaN * 0 is NaN. A span with no member
    # then sums to exactly 0, so 0 / 1 gives its E_s = 0.
    sums = torch.zeros(len(spans), dtype=WEIGHT_DTYPE).index_add_(0, span_id, torch.where(member > 0, e, 0.0))
    sizes = torch.zeros(len(spans), dtype=WEIGHT_DTYPE).index_add_(0, span_id, member)
    return sums / sizes.clamp_min(1.0)


def _span_ids(spans: list[Span], num_turns: int) -> torch.Tensor:
    ids = torch.empty(num_turns, dtype=torch.long)
    for k, (s, t) in enumerate(spans):
        ids[s:t] = k
    return ids


# --------------------------------------------------------------------------------------------------------------
# Gibbs allocation and exact bounded normalisation


def neutral_measure(token_counts: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """beta0_t = n_t / N: each turn's share of the trajectory's optimised tokens (GRPO's uniform credit).

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
    """Raw two-level credit weights w_t = beta_s alpha_t / beta0_t, before the bounds.

    beta_s is proportional to beta0_s exp(E_s / temp) over spans; alpha_t to beta0_t exp(e_t / temp) within
    span s. Computed in the log domain (stable for any evidence / temperature). Inside one span
    w_t = beta_s exp(e_t / temp) / sum_{u in s} beta0_u exp(e_u / temp), so it increases with e_t and does not
    depend on n_t. sum_t n_t w_t = N (up to rounding). Turns with n_t = 0 get 1.0 and are left out of the
    measure, as are spans made only of such turns. ``temperature = inf`` returns all ones.
    """
    e = as_vector(evidence, "evidence")
    counts = _counts(token_counts)
    if len(counts) != e.numel():
        raise ValueError(f"{len(counts)} token counts for {e.numel()} turns")
    spans = _check_partition(spans, e.numel())
    temperature = _positive_temperature(temperature)
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
    """Bounded normalisation: w' = clip(s * w, 1 - eps, 1 + eps) with the scale s chosen so sum n_t w'_t = N.

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
    w = as_vector(weights, "weights")
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


def gibbs_weights(
    evidence: TensorLike,
    token_counts: Sequence[int] | torch.Tensor,
    spans: Sequence[Span],
    temperature: float = DEFAULT_TEMPERATURE,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """Per-unit bounded Gibbs credit weights: hierarchical allocation + bounded normalisation.

    Args:
        evidence: e_t per unit (``turn_evidence``).
        token_counts: n_t, optimised tokens per turn.
        spans: the credit units, a contiguous partition of the units into (start, end) spans.
        temperature: credit temperature (default 1.0; ``inf`` = uniform).
        eps: weight bound (default 0.5).

    Returns:
        float64 (T,) with 1 - eps <= w_t <= 1 + eps, w_t > 0 and sum_t n_t w_t = N, so A~ = A w keeps the sign
        of A and the token-weighted mean advantage. All evidence 0 (no match anywhere with a zero local gap,
        A_i = 0, ...) gives exactly GRPO: every weight is exactly 1.0.
    """
    eps = _check_eps(eps)
    e = as_vector(evidence, "evidence")
    if not bool(torch.isfinite(e).all()):
        raise ValueError("evidence must be finite")
    if not bool((e != 0).any()):
        _check_partition(spans, e.numel())
        _positive_temperature(temperature)
        if len(_counts(token_counts)) != e.numel():
            raise ValueError(f"{len(_counts(token_counts))} token counts for {e.numel()} turns")
        return torch.ones_like(e)
    raw = hierarchical_weights(e, token_counts, spans, temperature=temperature)
    return bounded_normalize(raw, token_counts, eps=eps)
