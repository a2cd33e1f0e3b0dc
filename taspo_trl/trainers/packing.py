"""Repacking TRL's micro-batches: the same gradient from fewer rows and less padding.

TRL pads a whole generation batch to its longest prompt and its longest completion, shuffles it and cuts it
into ``steps_per_generation`` micro-batches, so every row of every micro-batch costs the batch's widest row,
and a row whose loss is identically zero still costs a forward and a backward. When the loss is a sum of
per-row terms over a normaliser fixed for the whole batch (see ``AgentGRPOTrainer._loss_is_row_sum``), the
micro-batches whose gradients are summed into one optimizer step may exchange rows and leave rows out without
changing that sum. ``repack`` then rebuilds them:

- rows outside ``keep`` are left out (rows whose loss is zero for every token);
- the others are sorted by length and cut into the same number of micro-batches, so rows of similar length
  share one and no micro-batch holds more rows than before (memory never grows);
- each micro-batch drops the columns none of its rows attends to;
- a micro-batch left without rows becomes a one-token placeholder whose loss is exactly 0, so every process
  still runs one forward and one backward per micro-batch (DDP's gradient all-reduce and TRL's metric
  reductions are collective) and the optimizer sees zero gradients where TRL's path would have produced them;
  placeholder rows also even out the row counts across processes, which TRL's per-row metric gathers need.
"""

from __future__ import annotations

from typing import Any

import torch

PROMPT_KEYS = ("prompt_ids", "prompt_mask")
"""Left-padded, prompt-aligned tensors; every other 2-D tensor of a micro-batch is completion-aligned, or holds
one column per row (the sequence-level importance-sampling ratio), which slicing from column 0 leaves whole."""

Batch = dict[str, Any]


def _per_row(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim > 0


def merge(micro_batches: list[Batch]) -> Batch:
    """One batch with the rows of ``micro_batches``, which TRL split from one padded batch (equal widths);
    0-d tensors (``num_items_in_batch``) are shared by all of them and kept once."""
    first = micro_batches[0]
    return {key: torch.cat([b[key] for b in micro_batches]) if _per_row(value) else value for key, value in first.items()}


def select_rows(batch: Batch, index: torch.Tensor) -> Batch:
    return {key: value[index] if _per_row(value) else value for key, value in batch.items()}


def _slice_columns(batch: Batch, prompt: slice, completion: slice) -> Batch:
    out = {}
    for key, value in batch.items():
        if key in PROMPT_KEYS:
            out[key] = value[:, prompt]
        elif _per_row(value) and value.ndim == 2:
            out[key] = value[:, completion]
        else:
            out[key] = value
    return out


def trim_padding(batch: Batch) -> Batch:
    """``batch`` without the columns no row attends to: leading prompt padding, trailing completion padding.

    Removing a column every row masks out changes no attended token; the positions of the remaining tokens
    all shift by the same amount, which rotary position embeddings leave invariant."""
    first = int(batch["prompt_mask"].any(0).int().argmax())
    attended = batch["completion_mask"].any(0).nonzero()
    end = int(attended.max()) + 1 if attended.numel() else 1  # TRL needs at least one completion column
    return _slice_columns(batch, slice(first, None), slice(0, end))


def placeholder(batch: Batch) -> Batch:
    """A one-row micro-batch (the last prompt token and the first completion column of ``batch``'s first row)
    with an all-zero loss mask and advantages: its loss is exactly 0 and every parameter's gradient is a zero
    tensor. The prompt token stays attended, so no attention row is fully masked (which gives NaN)."""
    width = batch["prompt_ids"].size(1)
    row = _slice_columns(select_rows(batch, torch.tensor([0])), slice(width - 1, None), slice(0, 1))
    row["completion_mask"] = torch.zeros_like(row["completion_mask"])
    row["advantages"] = torch.zeros_like(row["advantages"])
    return row


def _widen(batch: Batch, like: Batch) -> Batch:
    """``batch`` zero-padded to the widths of the same tensors in ``like`` (prompts on the left, completions on
    the right); the zeros are neither attended nor in the loss mask. Widths are taken tensor by tensor because
    not every 2-D tensor is completion-wide: the sequence-level importance-sampling ratio is one column per row."""
    out = {}
    for key, value in batch.items():
        if not (_per_row(value) and value.ndim == 2):
            out[key] = value
            continue
        missing = like[key].size(1) - value.size(1)
        out[key] = torch.nn.functional.pad(value, (missing, 0) if key in PROMPT_KEYS else (0, missing))
    return out


def micro_batch_sizes(rows: int, count: int) -> list[int]:
    """Rows per micro-batch when ``rows`` rows are cut into ``count`` micro-batches: as even as possible, and
    at least one (a placeholder) in each."""
    return [max(1, len(chunk)) for chunk in torch.tensor_split(torch.arange(rows), count)]


def repack(micro_batches: list[Batch], keep: torch.Tensor, sizes: list[int]) -> list[Batch]:
    """Micro-batches of ``sizes`` rows (one per entry, ``sum(sizes) >= keep.sum()``) holding the rows of
    ``micro_batches`` where ``keep`` (a bool per row of ``merge(micro_batches)``), sorted by length, each
    trimmed of padding; placeholder rows fill what the kept rows leave free.

    Every process must give each micro-batch the same number of rows: TRL's loss gathers per-row metrics
    across processes, and collectives need equal sizes. ``sizes`` is therefore computed from the largest
    number of kept rows over the processes; a process with fewer kept rows fills in placeholders."""
    merged = merge(micro_batches)
    filler = placeholder(merged)
    lengths = merged["prompt_mask"].sum(1) + merged["completion_mask"].sum(1)
    rows = keep.nonzero().squeeze(1)
    # Ascending, so that when the rows do not divide evenly the extra row goes to a micro-batch of short rows.
    ordered = rows[torch.argsort(lengths[rows], stable=True)].cpu()
    out, start = [], 0
    for size in sizes:
        chunk = ordered[start : start + size]
        start += chunk.numel()
        if chunk.numel() == 0:
            out.append(merge([filler] * size))
            continue
        batch = trim_padding(select_rows(merged, chunk))
        if chunk.numel() < size:
            widened = _widen(filler, batch)
            batch = merge([batch] + [widened] * (size - chunk.numel()))
        out.append(batch)
    return out
