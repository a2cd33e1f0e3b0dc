"""What the credit functions share: the dtype their weights are computed in and the check of a 1-D input."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["WEIGHT_DTYPE", "TensorLike", "as_vector"]

WEIGHT_DTYPE = torch.float64

TensorLike = torch.Tensor | Sequence[float]


def as_vector(values: TensorLike, name: str) -> torch.Tensor:
    """``values`` as a 1-D ``WEIGHT_DTYPE`` tensor; a ``ValueError`` naming ``name`` for any other shape."""
    out = torch.as_tensor(values, dtype=WEIGHT_DTYPE)
    if out.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(out.shape)}")
    return out
