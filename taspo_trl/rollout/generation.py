"""Generation backends for the agent loop: one batched call per turn, returning tokens and sampling log-probs.

``TransformersGenerator`` runs ``model.generate`` (CPU or GPU) and records, for every sampled token, its
log-probability under ``log_softmax(logits / temperature)``, the same quantity TRL's trainer recomputes,
so the rows the trainer builds can be checked token for token. ``TRLGenerator`` delegates to a
``GRPOTrainer``'s own generation path, which is TRL's vLLM integration (colocate or server) when
``use_vllm=True`` and the plain transformers path otherwise.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from transformers import LogitsProcessor, LogitsProcessorList


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    stopped: bool
    """True when the response ended on a stop (EOS) token, False when cut off by the length limit."""


class Generator(Protocol):
    def __call__(self, prompts: list[list[int]]) -> list[Generation]: ...


class _SampledLogProbRecorder(LogitsProcessor):
    """Keeps the log-probability of each sampled token without storing every step's full distribution.

    Custom processors run on the raw logits, before the sampling warpers (temperature, top-k, top-p), so
    ``log_softmax(scores / temperature)`` here is the distribution TRL's loss uses. The token sampled from
    step s is only known at step s + 1, so each call gathers the previous step's token and keeps one
    (batch, vocab) distribution alive.
    """

    def __init__(self, temperature: float, prompt_length: int):
        self.temperature = temperature
        self.prompt_length = prompt_length
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        if self.previous is not None and sequences.size(1) > self.prompt_length + len(self.steps):
            self.steps.append(self.previous.gather(1, sequences[:, -1:]).squeeze(1))
        self.previous = None
        if not self.steps:
            return torch.zeros(sequences.size(0), 0)
        return torch.stack(self.steps, dim=1).cpu()


class TransformersGenerator:
    """Batched sampling with ``transformers.generate``; left-pads the prompts of the live trajectories.

    Args:
        model: the policy (a PEFT model works); switched to eval mode while generating.
        tokenizer: its tokenizer (needs ``pad_token_id``).
        max_new_tokens: response limit per turn (paper: 512).
        temperature, top_p, top_k: sampling settings (paper: 1.0 / 1.0 / none); temperature 0 decodes greedily
            (the recorded log-probs are then those of the untempered distribution).
        batch_size: sequences per ``generate`` call; ``None`` = all live trajectories at once.
        model_context: a callable returning a context manager that yields the model to generate with
            (TRL's ``unwrap_model_for_generation`` under DeepSpeed/DDP); default uses ``model`` as is.
        generation_kwargs: further ``generate`` arguments, applied over the ones above as TRL applies its
            ``generation_kwargs`` (e.g. ``min_p``, ``repetition_penalty``). The log-prob recorder stays: it sees
            the logits after transformers' logit processors (a repetition penalty), before the sampling warpers.
        autocast_dtype: generate under ``torch.autocast`` with this dtype (the trainer's ``bf16`` / ``fp16``), as
            the trainer's own forward passes run; ``None`` = the model's dtype. ``generate`` bypasses the
            autocast wrapper Accelerate puts on ``forward``, so without this a float32 model samples in float32.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_new_tokens: int = 512,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_size: int | None = None,
        stop_token_ids: list[int] | None = None,
        model_context: Callable[[], Any] | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        autocast_dtype: torch.dtype | None = None,
    ):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 decodes greedily), got {temperature}.")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.batch_size = batch_size
        eos = stop_token_ids or _eos_ids(tokenizer, model)
        if not eos:
            raise ValueError("The tokenizer defines no EOS token; pass stop_token_ids to the generator.")
        self.stop_token_ids = eos
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        self.model_context = model_context or (lambda: nullcontext(self.model))
        self.generation_kwargs = dict(generation_kwargs or {})
        self.autocast_dtype = autocast_dtype

    def __call__(self, prompts: list[list[int]]) -> list[Generation]:
        if not prompts:
            return []
        step = self.batch_size or len(prompts)
        results: list[Generation] = []
        with self.model_context() as model, torch.no_grad(), self._precision(model):
            was_training = model.training
            model.eval()
            try:
                for start in range(0, len(prompts), step):
                    results.extend(self._generate(model, prompts[start : start + step]))
            finally:
                model.train(was_training)
        return results

    def _precision(self, model: Any) -> Any:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(next(model.parameters()).device.type, dtype=self.autocast_dtype)

    def _generate(self, model: Any, prompts: list[list[int]]) -> list[Generation]:
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        greedy = self.temperature == 0
        recorder = _SampledLogProbRecorder(1.0 if greedy else self.temperature, width)
        sampling = {} if greedy else {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        settings = {
            "do_sample": not greedy,
            **sampling,
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": self.stop_token_ids,
            "pad_token_id": self.pad_token_id,
            **self.generation_kwargs,
        }
        sequences = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            **settings,
            logits_processor=LogitsProcessorList([recorder]),
        )
        if not isinstance(sequences, torch.Tensor):
            sequences = sequences.sequences
        logprobs = recorder.finish(sequences)
        completions = sequences[:, width:].cpu()
        stop = set(self.stop_token_ids)
        out = []
        for row in range(len(prompts)):
            tokens = completions[row].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in stop), None)
            stopped = end is not None
            end = end if stopped else len(tokens)
            out.append(Generation(tokens[:end], logprobs[row, :end].tolist(), stopped))
        return out


class TRLGenerator:
    """Generates through a ``GRPOTrainer``: TRL's vLLM integration when the trainer uses vLLM.

    vLLM returns the sampled token's log-probability directly. In server mode the call is collective
    across processes, so every process must call it once per turn (the agent loop does, with an empty list
    when it has no live trajectory left).
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.stop_token_ids = list(trainer.eos_token_ids)

    def __call__(self, prompts: list[list[int]]) -> list[Generation]:
        completion_ids, logprobs = self.trainer._generate_single_turn(prompts, None, {}, 1)
        stop = set(self.stop_token_ids)
        out = []
        for ids, lps in zip(completion_ids, logprobs, strict=True):
            lps = [float("nan") if lp is None else float(lp) for lp in lps]
            out.append(Generation(list(ids), lps, bool(ids) and ids[-1] in stop))
        return out


def _eos_ids(tokenizer: Any, model: Any) -> list[int]:
    ids: list[int] = []
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for candidate in (tokenizer.eos_token_id, config_eos):
        if candidate is None:
            continue
        for token in candidate if isinstance(candidate, (list, tuple)) else [candidate]:
            if token not in ids:
                ids.append(int(token))
    return ids


def sampling_settings(args: Any) -> dict[str, Any]:
    """TRL's extra ``generate`` settings of a config (``min_p``, ``repetition_penalty``, ``cache_implementation``
    where set), with its ``generation_kwargs`` applied over them, as TRL's trainer assembles them."""
    names = ("min_p", "repetition_penalty", "cache_implementation")
    settings = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    return settings | dict(args.generation_kwargs or {})


def sampling_autocast_dtype(args: Any) -> torch.dtype | None:
    """The dtype the transformers sampler autocasts to under a config's mixed precision (``bf16`` / ``fp16``, as
    the trainer's forward passes run), ``None`` in full precision."""
    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return None


def generator_for_trainer(trainer: Any, batch_size: int | None = None) -> Generator:
    """The generator a ``GRPOTrainer`` would use: TRL's vLLM path when enabled, else ``transformers`` with
    sampling log-probs, on the model unwrapped for generation (DDP / DeepSpeed ZeRO-3 gathered)."""
    if trainer.use_vllm:
        return TRLGenerator(trainer)
    from trl.models.utils import unwrap_model_for_generation

    args = trainer.args
    return TransformersGenerator(
        trainer.model,
        trainer.processing_class,
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k or 0,
        batch_size=batch_size,
        stop_token_ids=list(trainer.eos_token_ids),
        model_context=lambda: unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ),
        generation_kwargs=sampling_settings(args),
        autocast_dtype=sampling_autocast_dtype(args),
    )
