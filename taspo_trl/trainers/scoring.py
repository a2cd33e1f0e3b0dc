"""The no-grad scoring passes of a training step that the credit methods share: log pi_old of the rollout
snapshot (``_snapshot_logprobs``), the one plain reference every gap subtracts (``_plain_logprobs``), TASPO's Eq. 3
privileged shifts (``_privileged_shifts``), the CPU log-prob path that computes only the completion's logits
(``_get_per_token_logps_and_entropies``), dropout off for those passes, and TRL's vLLM importance ratio between
the sampler and the trained model.

``ScoringPasses`` is a mixin of ``AgentGRPOTrainer``, before TRL's ``GRPOTrainer`` in its bases: it reads the
trainer's model, accelerator, tokenizer, chat format and arguments."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..privileged.rescoring import privileged_token_shifts, rescored_rows, score_continuations
from ..rollout.generation import sampling_autocast_dtype, trainer_compute_copy
from .step import StepView


class ScoringPasses:
    """The scoring passes of ``AgentGRPOTrainer`` (see the module docstring)."""

    def _snapshot_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
        """log pi_old of the last ``logits_to_keep`` tokens (no grad by the caller): until the update of this
        step, the current weights are the rollout snapshot. Runs through TRL's chunked log-prob function, so LoRA,
        DeepSpeed and the fused LM head behave as in the loss, with dropout off (``dropout_off``)."""
        device = self.accelerator.device
        with dropout_off(self.model):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids.to(device),
                attention_mask.to(device),
                logits_to_keep,
                batch_size=self.rescore_batch_size,
            )
        return logps

    @contextmanager
    def _scoring_passes(self) -> Iterator[None]:
        """One no-grad autocast region around a step's scoring forwards (each chunk of ``_snapshot_logprobs`` opens
        its own inside it). On CPU those forwards run the sampler's ``ComputeDtypeCopy``, whose linear weights are
        already in the compute dtype, so no chunk re-casts them; the weights do not change between the passes of a
        step."""
        with torch.no_grad(), self.accelerator.autocast():
            yield

    def _plain_logprobs(self, step: StepView, needed: Sequence[int], min_rows: int = 0) -> torch.Tensor:
        """log pi_old(y | h) of the completion tokens of ``step.batch`` (float32 on the CPU, shaped like
        ``batch["completion_ids"]``): the ONE plain reference that every privileged, aligned and teacher gap of a
        step subtracts. Only the rows in ``needed`` are sure to hold values; the others may be NaN.

        Those passes score the snapshot through :meth:`_snapshot_logprobs` (this trainer's forward, dropout off),
        so the plain side must be that same forward: any offset between two log-prob sources (vLLM against
        transformers, dropout noise) would otherwise become part of the gaps, and of some gaps only where two of
        them used different sources. TRL's ``old_per_token_logps`` are that forward when TRL computed them and no
        dropout is active; the sampling log-probs are when the transformers backend sampled in full precision (in
        eval mode, with the same weights). In the remaining cases the ``needed`` rows are scored once more, the way
        the privileged pass scores them (``score_continuations``: unpadded rows in length-sorted chunks, at least
        ``min_rows`` forwards so that processes stay in step): vLLM's log-probs without a recomputation, a
        recomputation that ran with dropout, and sampling under bf16/fp16 autocast, whose token-by-token decoding
        rounds differently from a forward over the whole row. Rows no gap reads (a failed group's) cost nothing."""
        batch, rows = step.batch, step.rows
        old = batch.get("old_per_token_logps")
        if old is not None and not _dropout_is_active(self.model):
            return old.float().cpu()
        if old is None and not self.use_vllm and sampling_autocast_dtype(self.args) is None:
            return batch["sampling_per_token_logps"].float().cpu()
        scored = score_continuations(
            [(rows.prompt_ids[r], rows.completion_ids[r]) for r in needed],
            self._snapshot_logprobs,
            self._tokenizer.pad_token_id,
            min_rows,
            self.rescore_batch_size,
        )
        plain = torch.full(tuple(batch["completion_ids"].shape), float("nan"))
        for r, logps in zip(needed, scored):
            plain[r, : len(logps)] = logps
        return plain

    def _privileged_shifts(
        self, step: StepView, contexts: Sequence[str], action_only: bool = True
    ) -> tuple[dict[tuple[int, int], torch.Tensor], torch.Tensor]:
        """Eq. 3 shifts of every turn whose trajectory has a non-empty entry in ``contexts`` (``privileged_token_shifts``:
        the action span, or the whole response with ``action_only=False``), and the plain log-probs they subtract.

        Both passes cover the rescored rows only, in one autocast region, with as many forwards on every process;
        without a rescored row anywhere (an all-fail step) neither runs a forward."""
        rescored = rescored_rows(step.rows, contexts)
        rescored_anywhere = self._max_over_processes(len(rescored))
        with self._scoring_passes():
            plain = self._plain_logprobs(step, rescored, rescored_anywhere)
            shifts = privileged_token_shifts(
                step.rows,
                step.trajectories,
                contexts,
                self.chat,
                self._snapshot_logprobs,
                plain,
                self._tokenizer.pad_token_id,
                min_rows=rescored_anywhere,
                action_only=action_only,
                batch_size=self.rescore_batch_size,
            )
        return shifts, plain

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """TRL's log-probs (and entropies) of the last ``logits_to_keep`` tokens, computed on CPU from those
        positions' logits only.

        TRL's fused log-prob head projects every position of the row through the LM head where Triton is
        unavailable (so that tile shapes stay fixed), prompt and padding included, and keeps only the
        completion's. On a turn-layout row the prompt is most of the row, so on CPU the head's projection,
        softmax and their backward dominate; here the model returns the ``logits_to_keep + 1`` needed logits
        and the same quantities follow: log_softmax(logits / temperature) at each token, its entropy, 0 at
        unattended positions. GPUs, router losses and multimodal inputs keep TRL's path."""
        if (
            input_ids.device.type != "cpu"
            or compute_aux_loss
            or self.args.cast_lm_head_to_fp32
            or any(value is not None for value in multimodal.values())
        ):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal,
            )
        scoring = not torch.is_grad_enabled() and model is self.model and not _dropout_is_active(model)
        copier = trainer_compute_copy(self) if scoring else None
        if copier is not None:  # a no-grad pass of the current weights: the sampler's compute-dtype copy, same numbers
            model = copier.of(self.accelerator.unwrap_model(model))
        step = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), step):
            ids, mask = input_ids[start : start + step], attention_mask[start : start + step]
            with self.accelerator.autocast():
                logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False).logits
            log_probs = (logits[:, :-1].float() / self.temperature).log_softmax(-1)
            unattended = mask[:, -logits_to_keep:] == 0
            logps.append(log_probs.gather(-1, ids[:, -logits_to_keep:, None]).squeeze(-1).masked_fill(unattended, 0.0))
            if compute_entropy:
                entropies.append((-(log_probs.exp() * log_probs).sum(-1)).masked_fill(unattended, 0.0))
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    @property
    def rescore_batch_size(self) -> int:
        return self.args.rescore_batch_size or self.args.per_device_train_batch_size

    def _max_over_processes(self, value: int) -> int:
        """Processes must run the same number of forward passes (DeepSpeed ZeRO-3 gathers weights collectively),
        so per-process row counts that differ (``turn`` layout) are padded to the largest."""
        if self.accelerator.num_processes == 1:
            return value
        return int(self.accelerator.gather(torch.tensor([value], device=self.accelerator.device)).max().item())


@contextmanager
def dropout_off(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for a scoring pass, then every module's own mode back.

    The rescoring passes compare log-probs of the same weights under two contexts; in train mode each pass would
    draw its own dropout masks (a LoRA adapter's ``lora_dropout`` too) and that noise would go straight into the
    gaps. Modes are restored module by module: a blanket ``train()`` would also switch on modules the caller
    keeps in eval mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _dropout_is_active(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` in its current modes draws dropout: a dropout module with p > 0 (LoRA's
    among them) or an attention layer with a dropout rate, which ``transformers`` applies functionally."""
    return any(
        module.training
        and (
            (isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0)
            or (isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0)
        )
        for module in model.modules()
    )


VLLM_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def vllm_importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> torch.Tensor:
    """TRL's correction for the gap between the sampler (vLLM) and the trained model, ``pi_old / pi_sampler``,
    with the semantics of TRL 1.16's ``vllm_importance_sampling_mode``.

    ``token_*`` modes give one ratio per token ([B, T]); ``sequence_*`` modes one per row ([B, 1]), the product
    of the row's token ratios (in the ``turn`` layout a row is one turn, in ``sequence`` one trajectory).
    ``*_truncate`` clamps the ratio into [``clip_min``, ``clip_max``]; ``*_mask`` sets a ratio outside that
    range to 0, so the token or row does not train. A bound that is None does not bound. Positions outside
    ``mask`` (prompt padding, environment tokens) and tokens the sampler could not score (NaN) contribute a log
    ratio of 0.
    """
    if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {VLLM_IMPORTANCE_SAMPLING_MODES}, got {mode!r}.")
    log_ratio = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    ratio = log_ratio.exp()
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    low = float("-inf") if clip_min is None else clip_min
    high = float("inf") if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
