"""The training sampler, made resumable.

TRL's ``RepeatSampler`` shuffles with its own generator, seeded once, drawing one permutation per pass over the
data, and has no ``set_epoch``. A trainer rebuilt to resume from a checkpoint therefore starts that generator
again: the epochs after the checkpoint replay the first epoch's order instead of the orders an uninterrupted run
draws. ``EpochReplaySampler`` adds ``set_epoch``, which ``transformers.Trainer`` calls at the start of every
epoch (the resumed one included); it draws the permutations of the epochs this sampler has not iterated, so
epoch ``e`` gets the same order whether or not the run was interrupted.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler
from trl.trainer.utils import RepeatSampler


class EpochReplaySampler(Sampler):
    """``sampler``'s indices, in the order of the epoch ``set_epoch`` names."""

    def __init__(self, sampler: RepeatSampler):
        self.sampler = sampler
        self.epochs_drawn = 0
        if sampler.shuffle:
            # accelerate synchronises a sampler's `generator` across processes; keep that pointing at the real one
            self.generator = sampler.generator

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[int]:
        self.epochs_drawn += 1
        return iter(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Advance the shuffle to ``epoch`` (0-based) by drawing the permutations of the epochs skipped over."""
        while self.sampler.shuffle and self.epochs_drawn < epoch:
            torch.randperm(self.sampler.num_samples, generator=self.sampler.generator)
            self.epochs_drawn += 1
