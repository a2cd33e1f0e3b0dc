"""Name -> function registries of the comparison methods' advantage transforms and loss terms.

``BaselineTrainer`` resolves the loss term of its ``baseline`` (e.g. ``baseline="sdar"``) with ``get_loss_term``;
``get_advantage_transform`` does the same for the advantage transforms. An unknown name fails early with the list of known names instead
of deep inside a training step. Names are lower-case method names as in the README's "Comparison methods"; OPSD and
OPD share the sampled-token reverse-KL estimator and differ only in the teacher (GRPO+OPSD uses OPSD's term with
its own coefficient). Every name here is reachable from ``BaselineConfig.baseline``; OPSD's generalised-JSD
variant is not built (docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from taspo_trl.credit.baselines import (
    gigpo_advantages,
    opid_advantages,
    rlsd_advantages,
    stepopsd_advantages,
)
from taspo_trl.credit.distillation import sampled_reverse_kl, sdar_loss, skill_sd_loss

__all__ = [
    "ADVANTAGE_TRANSFORMS",
    "LOSS_TERMS",
    "get_advantage_transform",
    "get_loss_term",
]

ADVANTAGE_TRANSFORMS: Mapping[str, Callable] = {
    "rlsd": rlsd_advantages,
    "opid": opid_advantages,
    "gigpo": gigpo_advantages,
    "stepopsd": stepopsd_advantages,
}

LOSS_TERMS: Mapping[str, Callable] = {
    "opsd": sampled_reverse_kl,
    "opd": sampled_reverse_kl,
    "sdar": sdar_loss,
    "skill_sd": skill_sd_loss,
}


def _lookup(table: Mapping[str, Callable], kind: str, name: str) -> Callable:
    key = str(name).strip().lower()
    if key not in table:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return table[key]


def get_advantage_transform(name: str) -> Callable:
    """The advantage transform registered as ``name`` (case-insensitive); ValueError listing the known names."""
    return _lookup(ADVANTAGE_TRANSFORMS, "advantage transform", name)


def get_loss_term(name: str) -> Callable:
    """The loss term registered as ``name`` (case-insensitive); ValueError listing the known names."""
    return _lookup(LOSS_TERMS, "loss term", name)
