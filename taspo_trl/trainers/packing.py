"""Repacking TRL's micro-batches: the same gradient from fewer rows and less padding.

TRL pads a whole generation batch to its longest prompt and its longest completion, shuffles it and cuts it
into ``steps_per_generation`` micro-batches, so every row of every micro-batch costs the batch's widest row,
and a row whose loss is identically zero still costs a forward and a backward. When the loss is a sum of
per-row terms over a normaliser fixed for the whole batch (see ``MicroBatchRepacking._loss_is_row_sum``), the
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


class MicroBatchRepacking:
    """``AgentGRPOTrainer``'s side of repacking (a mixin before TRL's ``GRPOTrainer`` in its bases): when the loss
    allows it exactly, TRL's micro-batches of each new generation batch are repacked once (``repack``), window by
    window of the micro-batches summed into one optimizer step."""

    @property
    def _loss_is_row_sum(self) -> bool:
        """Whether TRL's loss over the micro-batches of one optimizer step is a sum of per-row terms over a
        normaliser fixed for the whole generation batch, so rows may move between those micro-batches and a row
        whose terms are all 0 may be left out. True for the dapo / cispo / vespo losses (``num_items_in_batch``)
        unless a per-micro-batch quantity enters: the entropy bonus (a micro-batch mean), the top-entropy token
        mask (a quantile over the micro-batch) or a mixture-of-experts router loss. The grpo / bnpo / dr_grpo /
        luspo / sapo losses average over each micro-batch's own rows or tokens."""
        return (
            self.loss_type in ("dapo", "cispo", "vespo")
            and not self._entropy_bonus_enabled
            and self.top_entropy_quantile >= 1.0
            and not self.aux_loss_enabled
        )

    @property
    def _zero_advantage_rows_skippable(self) -> bool:
        """Whether a row whose advantages are all 0 has a zero gradient: its policy term is A times a ratio and
        A = 0; with ``beta = 0`` no KL term remains. The distillation baselines put their distillation term into
        the advantages (``credit.distillation.gradient_equivalent_advantages``), so it is covered by the same
        test; no trainer here adds a loss term of its own."""
        return self._loss_is_row_sum and self.beta == 0.0

    def _exchange_window(self) -> int:
        """How many consecutive micro-batches of one generation are summed into the same optimizer step."""
        accumulation, per_generation = self.args.gradient_accumulation_steps, self.args.steps_per_generation
        if accumulation % per_generation == 0:
            return per_generation
        if per_generation % accumulation == 0:
            return accumulation
        return 1  # windows straddle generations: rows stay in their own micro-batch

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        """TRL's micro-batch; in training, TRL's micro-batches of each new generation batch are repacked once."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        fresh = self._step % (self.args.steps_per_generation * self.num_iterations) == 0 or self._buffered_inputs is None
        inputs = super()._prepare_inputs(generation_batch)
        if not fresh:
            return inputs
        self._buffered_inputs = self._repacked(self._buffered_inputs)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _repacked(self, micro_batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``micro_batches`` repacked window by window (``packing.repack``). Rows without any token in the loss
        mask (layout padding) and, when exact, rows whose advantages are all 0 are left out. When the loss is not
        a row sum, every row stays in its micro-batch and only padding columns go."""
        row_sum = self._loss_is_row_sum
        window = self._exchange_window() if row_sum else 1
        windows, keeps = [], []
        skipped = real = 0
        for start in range(0, len(micro_batches), window):
            part = micro_batches[start : start + window]
            merged = merge(part)
            in_loss = merged["completion_mask"] * merged["tool_mask"] > 0
            is_real = in_loss.any(1)
            if not row_sum:
                keep = torch.ones_like(is_real)
            elif self._zero_advantage_rows_skippable:
                keep = (in_loss & (merged["advantages"] != 0)).any(1)
            else:
                keep = is_real
            skipped += int((is_real & ~keep).sum())
            real += int(is_real.sum())
            windows.append(part)
            keeps.append(keep)
        # Each window's micro-batch sizes follow the process with the most kept rows in it.
        local = torch.tensor([[skipped, real] + [int(k.sum()) for k in keeps]], device=self.accelerator.device)
        everywhere = self.accelerator.gather(local)
        counts, most_kept = everywhere[:, :2].sum(0), everywhere[:, 2:].max(0).values.tolist()
        out: list[dict[str, Any]] = []
        for part, keep, rows in zip(windows, keeps, most_kept, strict=True):
            out += repack(part, keep, micro_batch_sizes(rows, len(part)))
        self._metrics["train"]["rows/skipped"].append(float(counts[0]))
        self._metrics["train"]["rows/skipped_fraction"].append(float(counts[0]) / max(float(counts[1]), 1.0))
        return out
