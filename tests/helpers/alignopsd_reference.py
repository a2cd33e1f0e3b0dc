"""An independent reference of the official AlignOPSD composition (``mingju-c/Align-OPSD``), written from the
official formulas in plain Python (``math``, lists), for the trainer-level tests. Nothing here calls
``taspo_trl.credit.alignopsd`` or the trainer. Each function names the official function it follows; the file is
``verl/trainer/ppo/thinking_correspondence.py`` (mechanism 1) or ``correspondence_credit.py`` (mechanism 2).

Turns are keyed (task, rollout, turn); the batch is a dict of those keys in sorted order, as the official
``canonicalize_turns`` sorts the turn identities.
"""

from __future__ import annotations

import math
import random


def cosine(u, v) -> float:
    dot = sum(a * b for a, b in zip(u, v))
    return dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))


def log_softmax(values: list[float]) -> list[float]:
    top = max(values)
    total = math.log(sum(math.exp(v - top) for v in values)) + top
    return [v - total for v in values]


def quantile(values: list[float], q: float) -> float:
    """torch.quantile's linear interpolation (official ``adaptive_segmentation_threshold``)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def select(h: dict, keys: list, target, tau: float, top_k: int) -> list:
    """``select_sparse_sources``: H >= tau among eligible sources (same task, another rollout), the best source of
    each rollout, then the global top-k; ties by the turn identity."""
    task, rollout, _ = target
    candidates = [s for s in keys if s[0] == task and s[1] != rollout and h[(s, target)] >= tau]
    best = {}
    for source in sorted(candidates, key=lambda s: (-h[(s, target)], s)):
        best.setdefault(source[1], source)
    return sorted(best.values(), key=lambda s: (-h[(s, target)], s))[:top_k]


def corrected_gap(diagonal: float, student: float, sims: list[float], cross: list[float], tau: float,
                  temperature: float, alpha_max: float) -> float:
    """``combine_cross_teacher_scores`` on one token, probability mixture: log omega = log_softmax(s / T),
    rho = sum omega clamp((s - tau) / (1 - tau), 0, 1), alpha = min(alpha_max rho, alpha_max), mixture
    logsumexp(log omega + log p_k), gap = (1 - alpha) diagonal + alpha mixture - student."""
    if not sims or alpha_max == 0:
        return diagonal - student
    log_w = log_softmax([s / temperature for s in sims])
    rho = sum(math.exp(lw) * min(max((s - tau) / (1 - tau), 0.0), 1.0) for lw, s in zip(log_w, sims))
    alpha = min(max(alpha_max * rho, 0.0), alpha_max)
    terms = [lw + c for lw, c in zip(log_w, cross)]
    top = max(terms)
    mixture = top + math.log(sum(math.exp(t - top) for t in terms))
    return (1 - alpha) * diagonal + alpha * mixture - student


def profile(h: dict, keys: list, target, temperature: float, tau: float) -> tuple[dict, bool]:
    """``build_dense_correspondence_profiles``: softmax of H / temperature over every eligible source; valid when
    the best eligible similarity reaches tau."""
    task, rollout, _ = target
    sources = [s for s in keys if s[0] == task and s[1] != rollout]
    logits = [h[(s, target)] / temperature for s in sources]
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = sum(weights)
    return {s: w / total for s, w in zip(sources, weights)}, max(h[(s, target)] for s in sources) >= tau


def jsd_bits(p: dict, q: dict) -> float:
    """``normalized_js_divergence``: natural-log JSD / ln 2."""
    total = 0.0
    for key in p:
        m = 0.5 * (p[key] + q[key])
        if p[key] > 0:
            total += 0.5 * p[key] * (math.log(p[key]) - math.log(m))
        if q[key] > 0:
            total += 0.5 * q[key] * (math.log(q[key]) - math.log(m))
    return min(max(total / math.log(2), 0.0), 1.0)


def segment(distances: list, valid: list, threshold: float, lo: int = 2, hi: int = 8, fallback: float = 0.01,
            random_seed: int | None = None) -> list[tuple[int, int]]:
    """``segment_trajectories`` for one trajectory (adaptive, or random with ``random.Random(seed)``)."""
    n = len(distances)
    bounds = {0, n}

    def fits(p: int) -> bool:
        left, right = max(b for b in bounds if b < p), min(b for b in bounds if b > p)
        return p - left >= lo and right - p >= lo

    if random_seed is not None:
        order = list(range(lo, n - lo + 1))
        random.Random(random_seed).shuffle(order)
    else:
        order = sorted((p for p in range(1, n) if valid[p] and distances[p] > threshold), key=lambda p: (-distances[p], p))
    for p in order:
        if fits(p):
            bounds.add(p)
    while True:
        ordered = sorted(bounds)
        long = next(((a, b) for a, b in zip(ordered, ordered[1:]) if b - a > hi), None)
        if long is None:
            return list(zip(ordered, ordered[1:]))
        a, b = long
        guided = [p for p in range(a + lo, b - lo + 1) if valid[p] and distances[p] >= fallback]
        bounds.add(min(guided, key=lambda p: (-distances[p], p)) if guided
                   else min(range(a + lo, b - lo + 1), key=lambda p: (abs(p - (a + b) / 2), p)))


def project(raw: list[float], counts: list[int], upper: float = 4.0) -> list[float]:
    """``project_weighted_box_budget`` (box [0, upper]) by bisection on the shift, to 1e-13."""
    total = sum(counts)
    if all(0 <= x <= upper for x in raw):
        return list(raw)
    low, high = min(raw) - upper, max(raw)
    for _ in range(200):
        mid = 0.5 * (low + high)
        budget = sum(n * min(max(x - mid, 0.0), upper) for n, x in zip(counts, raw))
        low, high = (mid, high) if budget > total else (low, mid)
    shift = 0.5 * (low + high)
    return [min(max(x - shift, 0.0), upper) for x in raw]


def turn_weights(scores: list[float], counts: list[int], spans: list[tuple[int, int]], temperature: float,
                 mixing: float = 0.5, upper: float = 4.0) -> list[float]:
    """``compute_correspondence_credit_from_tensors``: span budgets softmax(log N_s + mean e / T), turn budgets
    softmax(log n_t + e_t / T) within the span, h = N b q / n, projection, w = (1 - m) + m x."""
    total = sum(counts)
    span_logits = [math.log(sum(counts[a:b])) + sum(scores[a:b]) / (b - a) / temperature for a, b in spans]
    span_budget = [math.exp(v) for v in log_softmax(span_logits)]
    raw = [0.0] * len(scores)
    for budget, (a, b) in zip(span_budget, spans):
        within = [math.exp(v) for v in log_softmax([math.log(counts[t]) + scores[t] / temperature for t in range(a, b)])]
        for t, q in zip(range(a, b), within):
            raw[t] = total * budget * q / counts[t]
    return [(1 - mixing) + mixing * x for x in project(raw, counts, upper)]


def turn_scope_advantages(rewards: list[float], turns: list[int], epsilon: float = 1e-6) -> list[float]:
    """``compute_unique_trajectory_grpo_advantage``, ``normalization_scope="turn"``: mean and unbiased std over
    the turn rows."""
    rows = [r for r, n in zip(rewards, turns) for _ in range(n)]
    mean = sum(rows) / len(rows)
    std = math.sqrt(sum((r - mean) ** 2 for r in rows) / (len(rows) - 1))
    return [(r - mean) / (std + epsilon) for r in rewards]


def invalid_residuals(rewards: list[float], invalid: list[bool], coefficient: float, epsilon: float = 1e-6) -> list[float]:
    """``compute_invalid_action_advantage_residual`` over one task's turn rows: normalise(R - c invalid) -
    normalise(R), mean and unbiased std, epsilon."""

    def normalise(values):
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        return [(v - mean) / (std + epsilon) for v in values]

    penalised = [r - coefficient * bad for r, bad in zip(rewards, invalid)]
    return [a - b for a, b in zip(normalise(penalised), normalise(rewards))]
