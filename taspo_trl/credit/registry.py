"""Name -> function registries of the comparison methods' advantage transforms and loss terms.

The trainer resolves a config string (e.g. ``credit_method="rlsd"``, ``distill_loss="sdar"``) with
``get_advantage_transform`` / ``get_loss_term``; an unknown name fails early with the list of known names instead
of deep inside a training step. Names are lower-case method names as in the README's "Comparison methods" ("grpo+opsd" is
``combine_losses``; OPSD and OPD share the sampled-token reverse-KL estimator and differ only in the teacher).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from taspo_trl.credit.baselines import (
    gigpo_advantages,
    opid_advantages,
    rlsd_advantages,
    stepopsd_advantages,
)
from taspo_trl.credit.distillation import (
    combine_losses,
    generalized_jsd,
    sampled_reverse_kl,
    sdar_loss,
    skill_sd_loss,
)

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
    "opsd_jsd": generalized_jsd,
    "opd": sampled_reverse_kl,
    "grpo+opsd": combine_losses,
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
