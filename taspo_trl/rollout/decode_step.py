"""The CPU sampler's decode step: a handful of rows, one new token each, through the compute-dtype copy's weights.

A decode step of a small model reads every weight once and computes little, so on a CPU its time goes to the
matmuls' memory reads and to the fixed cost of each operator call. Two things here cut both without changing a
single number the model computes:

- ``_DecodeLinear``: the copy's linear layers keep their weights in oneDNN's blocked layout for few-row inputs,
  where the plain layout's matmul spends most of its time outside the memory reads.
- ``FusedDecodeStep``: for the Llama layout (Llama, Qwen2, Mistral), q/k/v and gate/up multiply as one blocked
  matrix each, and the step calls the model's own norms, rotary embedding, attention function and cache layers
  directly, without the per-call bookkeeping of the model's modules and decorators. LoRA adapters (PEFT) add their
  terms to each projection's slice of the stacked product as PEFT's layer adds them to the projection's output.

Both are used only where ``_blocked_layout_agrees`` found, on this CPU, that the blocked matmul gives every column
the plain matmul's bits, whether or not its weight is stacked with others.
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from typing import Any

import torch
from torch.nn.functional import rms_norm
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

_DECODE_ROWS = 64
"""Inputs of at most this many rows (a decode step's batch) take a linear layer's blocked weight."""


def _blocked(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 8)


def _blocked_matmul(rows: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows, blocked, bias, "none", [], "")


class _DecodeLinear(torch.nn.Linear):
    """A linear layer of the compute-dtype copy that also keeps its weight in oneDNN's blocked layout, laid out for a
    few rows. Prefills and scoring passes (many rows) take the plain weight. The blocked copy is remade when the
    weight changes (its version counter moves, as the copy's refresh moves it)."""

    @classmethod
    def adopt(cls, linear: torch.nn.Linear) -> None:
        """Turn the copy's ``linear`` into one of these in place, keeping its parameters and any hooks on it."""
        linear.__class__ = cls
        linear._blocked, linear._blocked_version = None, -1

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        input = input.to(self.weight.dtype)  # what autocast does to a linear layer's input
        if input.numel() > _DECODE_ROWS * self.in_features:
            return torch.nn.functional.linear(input, self.weight, self.bias)
        if self._blocked_version != self.weight._version:
            self._blocked, self._blocked_version = _blocked(self.weight), self.weight._version
        # Rows as a matrix: oneDNN takes a slower path for a (batch, 1, features) input than for the same rows flat.
        out = _blocked_matmul(input.reshape(-1, self.in_features), self._blocked, self.bias)
        return out.view(*input.shape[:-1], self.out_features)


@functools.cache
def _blocked_layout_agrees(dtype: torch.dtype) -> bool:
    """Whether this CPU's blocked-layout matmul in ``dtype`` gives the plain matmul's numbers, bit for bit, also with
    weights stacked into one matrix (checked once per process at 1 to 64 rows, on the embedded model's widths, small
    ones and LoRA factors' stacks), so that the copy samples what autocast over the float32 weights would sample.
    False where oneDNN lacks the dtype."""
    supported = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    check = getattr(torch.ops.mkldnn, supported.get(dtype, ""), None)
    if check is None or not torch.backends.mkldnn.is_available() or not check():
        return False
    generator = torch.Generator().manual_seed(0)
    for outers, inner in (((576, 192, 192), 576), ((1536, 1536), 576), ((576,), 1536), ((4099,), 96),
                          ((128, 32, 32), 64), ((64, 64), 128), ((16, 16, 16), 576), ((4, 4, 8), 64)):
        weights = [(torch.randn(outer, inner, generator=generator) / inner**0.5).to(dtype) for outer in outers]
        stacked = _blocked(torch.cat(weights))
        for rows in (1, 3, 8, 17, _DECODE_ROWS):
            rows_in = torch.randn(rows, inner, generator=generator).to(dtype)
            plain = torch.cat([torch.nn.functional.linear(rows_in, weight) for weight in weights], dim=-1)
            separate = torch.cat([_blocked_matmul(rows_in, _blocked(weight), None) for weight in weights], dim=-1)
            if not (torch.equal(plain, separate) and torch.equal(plain, _blocked_matmul(rows_in, stacked, None))):
                return False
    return True


_STEPS: "weakref.WeakKeyDictionary[Any, FusedDecodeStep | None]" = weakref.WeakKeyDictionary()

_LLAMA_LAYOUT = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
"""Models whose decoder layer is exactly: RMS norm, q/k/v projections, rotary embedding, cache, attention, o projection,
residual; RMS norm, down(act(gate) * up), residual. Their RMS norm computes what torch's ``rms_norm`` computes, bit for
bit. Other classes (Qwen3's q/k norms, Gemma's scaled embeddings and extra norms) take the model's own forward."""


def _stacked(linears: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The blocked matrix of ``linears``' weights stacked, and their stacked biases (``None`` without biases)."""
    bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears]).detach()
    return _blocked(torch.cat([linear.weight for linear in linears])), bias


def _unwrapped(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (itself where there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The Llama layout's rotary embedding (``apply_rotary_pos_emb`` of one tensor, ``cos``/``sin`` unsqueezed)."""
    half = states.shape[-1] // 2
    return states * cos + torch.cat((-states[..., half:], states[..., :half]), dim=-1) * sin


def _adapters(linear: Any) -> list[tuple[Any, Any, Any, float]]:
    """The (dropout, A, B, scaling) of each LoRA adapter that PEFT's forward of ``linear`` applies, in its order;
    empty for a plain linear layer."""
    if not hasattr(linear, "lora_A"):
        return []
    return [(linear.lora_dropout[name], linear.lora_A[name], linear.lora_B[name], linear.scaling[name])
            for name in linear.active_adapters if name in linear.lora_A]


def _plain_lora(linear: Any) -> bool:
    """Whether ``linear`` is PEFT's LoRA linear layer over a ``_DecodeLinear`` whose forward is the base output plus
    ``B(A(x)) * scaling`` per active adapter: adapters on and not merged, no DoRA or other variant, no dropout that
    would draw (the sampler's model is in eval mode, where PEFT's dropout hands its input on)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    return (type(linear) is LoraLinear and type(linear.base_layer) is _DecodeLinear and not linear.disable_adapters
            and not linear.merged and not any(name in linear.lora_variant for name in linear.active_adapters)
            and not any(dropout.training and not isinstance(dropout, torch.nn.Identity)
                        for dropout, *_ in _adapters(linear)))


def _plus_scaled(result: torch.Tensor, term: torch.Tensor, scaling: float) -> torch.Tensor:
    """``result + term * scaling`` as PEFT computes it. With a scaling of 1, 2, 4, ... (PEFT's default alpha = 2r
    gives 2) the product is exact, so one addition with ``alpha`` rounds as the two operations do, in one call."""
    if scaling >= 1 and math.frexp(scaling)[0] == 0.5:
        return torch.add(result, term, alpha=scaling)
    return result + term * scaling


def _stacked_factors(linears: tuple[Any, ...]) -> tuple[torch.Tensor, list[list[tuple[int, int, Any, float]]]] | None:
    """The A factor of every active adapter of ``linears`` (in PEFT's order) stacked into one blocked matrix, since
    the linears share their input, and for each linear the (first, last column of that product, B, scaling) of its
    adapters; ``None`` where none has adapters."""
    factors, terms, width = [], [], 0
    for linear in linears:
        own = []
        for _, lora_a, lora_b, scaling in _adapters(linear):
            factors.append(lora_a.weight)
            own.append((width, width + lora_a.out_features, lora_b, scaling))
            width += lora_a.out_features
        terms.append(own)
    return (_blocked(torch.cat(factors)), terms) if factors else None


def _with_adapters(product: torch.Tensor, linears: tuple[Any, ...], rows_in: torch.Tensor,
                   factors: tuple[torch.Tensor, list[list[tuple[int, int, Any, float]]]] | None) -> torch.Tensor:
    """The stacked ``product`` of ``linears`` with each one's LoRA terms added to its own columns, as PEFT adds them
    to that layer's output (the same numbers: the A products of ``factors`` are the columns each A gives alone)."""
    if factors is None:
        return product
    stacked, terms = factors
    reduced = _blocked_matmul(rows_in, stacked, None)
    columns, start = [], 0
    for linear, own in zip(linears, terms):
        result = product[:, start : start + linear.out_features]
        start += linear.out_features
        for first, last, lora_b, scaling in own:
            result = _plus_scaled(result, lora_b(reduced[:, first:last]), scaling)
        columns.append(result)
    return torch.cat(columns, dim=-1)


def _projected(linear: Any, rows_in: torch.Tensor) -> torch.Tensor:
    """``linear(rows_in)`` for a ``_DecodeLinear`` or a plain LoRA layer over one, without PEFT's per-call checks."""
    if not hasattr(linear, "lora_A"):
        return linear(rows_in)
    result = linear.base_layer(rows_in)
    for _, lora_a, lora_b, scaling in _adapters(linear):
        result = _plus_scaled(result, lora_b(lora_a(rows_in)), scaling)
    return result


class FusedDecodeStep:
    """One decode step of a Llama-layout compute-dtype copy, computing the numbers its forward computes.

    ``for_model(model)`` returns the step kept on the copy, or ``None`` where the model is not of the Llama layout
    (bare or under PEFT's LoRA), attends with anything but SDPA, has a linear layer that is neither a plain
    ``_DecodeLinear`` nor a plain LoRA layer over one (adapters off or merged, DoRA), or has a forward hook anywhere
    (which the step would bypass). Call it under the sampler's autocast with the step's token ids, their positions
    and the whole attention mask so far; it returns the logits of the new position.
    """

    def __init__(self, model: Any):
        self.model = _unwrapped(model)
        self.inner = self.model.model
        self.config = self.inner.config
        self.attend = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        takes_cache = "cache" in inspect.signature(create_causal_mask).parameters
        self.cache_keyword = "cache" if takes_cache else "past_key_values"
        # Every layer's (q, k, v) and (gate, up), the matrices each step multiplies as one.
        self.groups = [((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                        (layer.mlp.gate_proj, layer.mlp.up_proj)) for layer in self.inner.layers]
        first = self.inner.layers[0].self_attn
        self.query_key = first.q_proj.out_features + first.k_proj.out_features  # where the values start in q/k/v
        self.heads = first.q_proj.out_features // first.head_dim
        self._stacked: list[tuple[tuple[Any, ...], ...]] = []  # per layer: (weight, bias, LoRA factors) per group
        self._sources: list[torch.Tensor] = []
        self._versions: list[tuple[int, int]] = []

    @classmethod
    def for_model(cls, model: Any) -> FusedDecodeStep | None:
        # Checked at every call (once per generate): adapters can be switched off or merged, hooks added, in between.
        if not cls._fits(model):
            return None
        if model not in _STEPS:
            _STEPS[model] = cls(model)
        step = _STEPS[model]
        step._watch()
        return step

    @staticmethod
    def _fits(model: Any) -> bool:
        base = _unwrapped(model)
        if type(base).__name__ not in _LLAMA_LAYOUT or getattr(base.config, "_attn_implementation", None) != "sdpa":
            return False
        if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
            return False
        if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
            return False
        for layer in base.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            linears = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj,
                       mlp.up_proj, mlp.down_proj)
            if any(type(linear) is not _DecodeLinear and not _plain_lora(linear) for linear in linears):
                return False
            if (attention.q_proj.bias is None) != (attention.k_proj.bias is None) or (mlp.gate_proj.bias is None) != (
                    mlp.up_proj.bias is None):
                return False
        return type(base.lm_head) is _DecodeLinear

    def _watch(self) -> None:
        """Notes the tensors the stacked matrices are made of: each group's weights and its active adapters' A factors
        (once per ``for_model``, since adapters are switched between generate calls, not within one)."""
        self._sources = [tensor for groups in self.groups for group in groups for linear in group
                         for tensor in (linear.weight, *(lora_a.weight for _, lora_a, _, _ in _adapters(linear)))]

    def _refresh(self) -> None:
        """Stacks each group's weights, biases and LoRA A factors again when any of them changed (or other adapters
        became active) since."""
        versions = [(id(tensor), tensor._version) for tensor in self._sources]
        if versions != self._versions:
            self._stacked = [tuple((*_stacked(group), _stacked_factors(group)) for group in groups)
                             for groups in self.groups]
            self._versions = versions

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        self._refresh()
        inner, rows = self.inner, input_ids.size(0)
        hidden = inner.embed_tokens(input_ids)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                  position_ids=position_ids, **{self.cache_keyword: cache})
        cos, sin = inner.rotary_emb(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for index, layer in enumerate(inner.layers):
            attention, mlp = layer.self_attn, layer.mlp
            (qkv_weight, qkv_bias, qkv_factors), (gate_up_weight, gate_up_bias, gate_up_factors) = self._stacked[index]
            norm = layer.input_layernorm
            normed = rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)
            normed = normed.to(attention.q_proj.weight.dtype).reshape(rows, -1)
            qkv = _with_adapters(_blocked_matmul(normed, qkv_weight, qkv_bias), self.groups[index][0], normed,
                                 qkv_factors)
            # The rotary embedding of queries and keys in one pass: elementwise, so each element as when apart.
            rotated = _rotate(qkv[:, : self.query_key].view(rows, 1, -1, attention.head_dim).transpose(1, 2), cos, sin)
            query, key = rotated[:, : self.heads].contiguous(), rotated[:, self.heads :]
            value = qkv[:, self.query_key :].view(rows, 1, -1, attention.head_dim).transpose(1, 2)
            key, value = cache.layers[index].update(key, value)
            attended, _ = self.attend(attention, query, key, value, mask, dropout=0.0, scaling=attention.scaling)
            hidden = hidden + _projected(attention.o_proj, attended.reshape(rows, -1)).view(rows, 1, -1)
            norm = layer.post_attention_layernorm
            normed = rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)
            normed = normed.to(mlp.gate_proj.weight.dtype).reshape(rows, -1)
            gate, up = _with_adapters(_blocked_matmul(normed, gate_up_weight, gate_up_bias), self.groups[index][1],
                                      normed, gate_up_factors).chunk(2, dim=-1)
            hidden = hidden + _projected(mlp.down_proj, mlp.act_fn(gate) * up).view(rows, 1, -1)
        return self.model.lm_head(inner.norm(hidden))[:, -1]
