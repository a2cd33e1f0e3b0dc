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

import copy
import inspect
import types
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import (DynamicCache, LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)
from transformers.cache_utils import DynamicLayer

from .decode_step import FusedDecodeStep, _blocked_layout_agrees, _DecodeLinear


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
            On CPU the sampler then runs a ``ComputeDtypeCopy`` of the model, whose linear weights are already in
            that dtype: the same numbers as autocast over the float32 weights, without re-casting them every step.
        compute_copy: that copy, where the caller keeps one across calls (``trainer_compute_copy``); default: the
            generator's own.
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
        compute_copy: ComputeDtypeCopy | None = None,
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
        if compute_copy is None and autocast_dtype is not None:
            compute_copy = ComputeDtypeCopy(autocast_dtype)
        self.compute_copy = compute_copy

    def __call__(self, prompts: list[list[int]]) -> list[Generation]:
        if not prompts:
            return []
        step = self.batch_size or len(prompts)
        results: list[Generation] = []
        with self.model_context() as model, torch.no_grad(), self._precision(model):
            if self.compute_copy is not None and next(model.parameters()).device.type == "cpu":
                model = self.compute_copy.of(model)
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
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        room = width + self.max_new_tokens
        cache = None if "cache_implementation" in self.generation_kwargs else growing_cache(model, room)
        if cache is not None and self._decodes_itself(model):
            completions, logprobs = self._decode(model, input_ids, attention_mask, cache)
        else:
            completions, logprobs = self._generate_with_transformers(model, input_ids, attention_mask, cache)
        stop = set(self.stop_token_ids)
        out = []
        for row in range(len(prompts)):
            tokens = completions[row].tolist()
            end = next((k + 1 for k, t in enumerate(tokens) if t in stop), None)
            stopped = end is not None
            end = end if stopped else len(tokens)
            out.append(Generation(tokens[:end], logprobs[row, :end].tolist(), stopped))
        return out

    def _decodes_itself(self, model: Any) -> bool:
        """Whether the sampler's own loop computes what ``generate`` would: no extra ``generate`` settings (beyond
        ones that change nothing, such as TRL's default repetition penalty of 1.0), nothing in the model's generation
        config beyond token ids, and a forward that takes position ids and ``logits_to_keep``."""
        extra = {key for key, value in self.generation_kwargs.items() if _NO_EFFECT.get(key, object()) != value}
        if extra or set(model.generation_config.to_diff_dict()) - _PLAIN_GENERATION_CONFIG:
            return False
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        return {"position_ids", "logits_to_keep"} <= set(inspect.signature(type(base).forward).parameters)

    def _decode(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampling as ``generate`` samples without extra settings (the same model inputs at every step, temperature,
        top-k and top-p warpers in its order, finished rows fed the pad token), in a plain loop without ``generate``'s
        per-step bookkeeping, which costs a CPU decode step of a small model a large share. The one difference is
        the draw: ``sample_rows`` instead of ``torch.multinomial``, an exact draw from the same distribution with
        other random numbers, so a seed samples other tokens than ``generate`` would. After the prefill, a
        Llama-layout compute-dtype copy decodes through its ``FusedDecodeStep`` (the same logits, fewer calls)."""
        rows = input_ids.size(0)
        greedy = self.temperature == 0
        warpers = LogitsProcessorList()
        if not greedy and self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if not greedy and self.top_k:
            warpers.append(TopKLogitsWarper(self.top_k))
        if not greedy and self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(self.top_p))
        stops = torch.tensor(self.stop_token_ids, device=input_ids.device)
        finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        step_ids, tokens, logprobs = input_ids, [], []
        cache_argument = {_cache_keyword(model): cache}  # an inspect.signature: once, not at every step
        fused_step = FusedDecodeStep.for_model(model)
        for step in range(self.max_new_tokens):
            if step and fused_step is not None:
                logits = fused_step(step_ids, positions, attention_mask, cache).float()
            else:
                output = model(input_ids=step_ids, attention_mask=attention_mask, position_ids=positions,
                               use_cache=True, logits_to_keep=1, **cache_argument)
                logits = output.logits[:, -1].float()
            recorded = torch.log_softmax(logits if greedy else logits / self.temperature, dim=-1)
            chosen = logits.argmax(-1) if greedy else sample_rows(torch.softmax(warpers(step_ids, logits), dim=-1))
            chosen = chosen.masked_fill(finished, self.pad_token_id)
            tokens.append(chosen)
            logprobs.append(recorded.gather(1, chosen[:, None]).squeeze(1))
            finished |= torch.isin(chosen, stops)
            if bool(finished.all()):
                break
            step_ids, positions = chosen[:, None], positions[:, -1:] + 1
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, 1)], dim=1)
        if not tokens:
            return input_ids.new_zeros(rows, 0).cpu(), torch.zeros(rows, 0)
        return torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).cpu()

    def _generate_with_transformers(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                    cache: DynamicCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        width = input_ids.size(1)
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
        if cache is not None:
            settings[_cache_keyword(model)] = cache
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings,
                                   logits_processor=LogitsProcessorList([recorder]))
        if not isinstance(sequences, torch.Tensor):
            sequences = sequences.sequences
        return sequences[:, width:].cpu(), recorder.finish(sequences)


_PLAIN_GENERATION_CONFIG = {"bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "output_attentions",
                            "output_hidden_states", "_from_model_config", "transformers_version", "temperature",
                            "top_p", "top_k", "do_sample"}
"""Generation-config fields the sampler's own loop applies or that change no sample (the sampling settings are the
generator's own): any other field (a repetition penalty, a minimum length, ...) sends it to ``generate``."""
_NO_EFFECT = {"repetition_penalty": 1.0}
"""``generate`` settings at a value with which ``generate`` adds no logits processor."""


def sample_rows(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` (non-negative weights of a categorical distribution, any scale), drawn by
    inverting the row's cumulative distribution at one uniform number: an exact draw from the distribution.
    ``torch.multinomial`` on CPU draws an exponential number per vocabulary entry instead, which on a small model
    costs as much as several of its layers. Entries of weight 0 are never drawn."""
    cumulative = probs.double().cumsum(dim=-1)
    total = cumulative[:, -1:]
    draws = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total
    chosen = torch.searchsorted(cumulative, draws, right=True).squeeze(1)
    last_positive = probs.size(-1) - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1)
    return torch.minimum(chosen, last_positive)  # a draw rounded up to the total lands on the last entry of weight > 0


class _GrowingLayer(DynamicLayer):
    """One layer's KV cache in a buffer with room for the whole response: a decode step writes its token in place.
    ``DynamicLayer`` concatenates instead, copying the layer's whole cache at every step. Under autocast the buffer
    holds the compute dtype, the values attention would cast the cache to anyway. Returns views of the filled part,
    so attention computes exactly what it computes over ``DynamicLayer``'s tensors, and the samples are the same."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        device = key_states.device.type
        if torch.is_autocast_enabled(device):
            # Attention casts the cache to the compute dtype at every step under autocast; rounding each position
            # once, here, gives it the same values (float32 rotary outputs would otherwise be re-cast every step).
            dtype = torch.get_autocast_dtype(device)
            key_states, value_states = key_states.to(dtype), value_states.to(dtype)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.key_buffer is None or self.keys.shape[-2] != self.length or self.keys.data_ptr() != self.key_buffer.data_ptr():
            self._rebuffer(self.keys, self.values, key_states)  # first call, or a cache method replaced the tensors
        end = self.length + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:
            self._rebuffer(self.keys, self.values, key_states, room=max(end, 2 * self.key_buffer.shape[-2]))
        self.key_buffer[..., self.length : end, :] = key_states
        self.value_buffer[..., self.length : end, :] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self.keys, self.values

    def _rebuffer(self, keys: torch.Tensor, values: torch.Tensor, like: torch.Tensor, room: int | None = None) -> None:
        held = keys.shape[-2] if keys.dim() == 4 else 0
        room = max(room or self.capacity, held + like.shape[-2])
        shape = (*like.shape[:2], room, like.shape[-1])
        self.key_buffer, self.value_buffer = like.new_empty(shape), like.new_empty(shape)
        if held:
            self.key_buffer[..., :held, :] = keys
            self.value_buffer[..., :held, :] = values
        self.length = held


def growing_cache(model: Any, capacity: int) -> DynamicCache | None:
    """A ``DynamicCache`` of ``_GrowingLayer``s with room for ``capacity`` positions, for a model whose cache would be
    plain ``DynamicLayer``s (full attention everywhere); ``None`` (``generate``'s own cache) for any other."""
    cache = DynamicCache(config=model.config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [_GrowingLayer(capacity) for _ in cache.layers]
    return cache


def _cache_keyword(model: Any) -> str:
    """``generate``'s name for a cache object: ``cache`` where the model's forward takes it (newer transformers
    warn on the older ``past_key_values``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


class ComputeDtypeCopy:
    """A copy of a model for sampling under autocast on CPU, with the weights of every linear layer already in the
    compute dtype and everything else (embeddings, norms) as in the model, so the copy under autocast computes the
    same numbers as the model under autocast: autocast rounds float32 weights to the compute dtype the same way,
    but again at every decode step. A tied output layer gets its own rounded weight.

    ``of(model)`` returns the copy, first refreshing it when the model's weights changed since (an optimizer step, seen
    through a hook on every optimizer's step, or an in-place update that moves a tensor's version counter, such as a
    checkpoint's ``load_state_dict``) or making it anew for another model. What TRL does for vLLM, which holds its
    own copy of the weights, loaded after each step.
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._source: weakref.ref | None = None
        self._copy: Any = None
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._versions: list[int] = []
        self._stepped = False
        _watch_optimizer_steps(self)

    def of(self, model: Any) -> Any:
        if self._source is None or self._source() is not model or [id(t) for t in _own_tensors(model)] != [
                id(source) for source, _ in self._pairs]:  # another model, or tensors replaced (assign=True loads)
            self._make(model)
        versions = [source._version for source, _ in self._pairs]
        if versions != self._versions or self._stepped:
            with torch.no_grad():
                for source, mirror in self._pairs:
                    mirror.copy_(source)
            self._versions, self._stepped = versions, False
        return self._copy

    def _make(self, model: Any) -> None:
        self._copy, self._pairs = None, []  # free the old copy before making the new one
        mirror = copy.deepcopy(model)
        for module in mirror.modules():
            # A forward set on the instance (Accelerate's autocast wrapper, TRL's fused LM head) is a closure over the
            # original model's forward, which deepcopy keeps: the copy would run the original's weights.
            module.__dict__.pop("forward", None)
        # The copy's linear layers hand the compute dtype on, which only autocast reconciles with the float32 rest.
        device = next(model.parameters()).device.type
        mirror.forward = types.MethodType(torch.autocast(device, dtype=self.dtype)(type(mirror).forward), mirror)
        blocked = _blocked_layout_agrees(self.dtype)
        for module in mirror.modules():
            if isinstance(module, torch.nn.Linear):
                for name, tensor in list(module.named_parameters(recurse=False)):
                    setattr(module, name, torch.nn.Parameter(tensor.detach().to(self.dtype), requires_grad=False))
                if blocked and type(module) is torch.nn.Linear:
                    _DecodeLinear.adopt(module)
        mirror.requires_grad_(False)
        mirror.eval()  # it only samples and scores: no dropout, whatever mode the trained model is in
        mirrored = dict(mirror.named_modules())
        self._pairs = [(tensor, getattr(mirrored[path], name)) for path, name, tensor in _own_tensors(model, named=True)]
        self._copy, self._source = mirror, weakref.ref(model)
        self._versions = [source._version for source, _ in self._pairs]


_WATCHED_COPIES: "weakref.WeakSet[ComputeDtypeCopy]" = weakref.WeakSet()
_STEP_HOOK: Any = None


def _watch_optimizer_steps(copier: ComputeDtypeCopy) -> None:
    """Marks ``copier`` for a refresh after every optimizer step: a fused optimizer (``adamw_torch_fused``,
    transformers' default) updates the weights in place without moving their version counters, so the copy can't
    see that step by itself. One process-wide hook serves every copy."""
    global _STEP_HOOK
    if _STEP_HOOK is None:
        _STEP_HOOK = register_optimizer_step_post_hook(_mark_stepped)
    _WATCHED_COPIES.add(copier)


def _mark_stepped(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for copier in list(_WATCHED_COPIES):
        copier._stepped = True


def _own_tensors(model: Any, named: bool = False) -> list[Any]:
    """Each module's own parameters, module by module (a tied weight once per module that holds it)."""
    return [(path, name, tensor) if named else tensor
            for path, module in model.named_modules() for name, tensor in module.named_parameters(recurse=False)]


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


def trainer_compute_copy(trainer: Any) -> ComputeDtypeCopy | None:
    """The trainer's one ``ComputeDtypeCopy`` (made on first use), shared by its sampler and its no-grad scoring
    passes, so that it is made once per run and refreshed once per optimizer step; ``None`` in full precision."""
    dtype = sampling_autocast_dtype(trainer.args)
    if dtype is None:
        return None
    if getattr(trainer, "_compute_dtype_copy", None) is None:
        trainer._compute_dtype_copy = ComputeDtypeCopy(dtype)
    return trainer._compute_dtype_copy


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
        compute_copy=trainer_compute_copy(trainer),
    )
