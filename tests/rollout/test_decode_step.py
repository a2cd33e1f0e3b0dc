"""The sampler's fused decode step against the model's own forward: the same logits, bit for bit, at every step of a
padded batch, for the Llama layout with and without projection biases, after the weights change, and never where the
step would bypass something the model's forward does."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from taspo_trl.rollout.decode_step import FusedDecodeStep, _blocked_layout_agrees
from taspo_trl.rollout.generation import ComputeDtypeCopy, growing_cache
from taspo_trl.testing import make_tiny_model_dir

needs_blocked_bf16 = pytest.mark.skipif(not _blocked_layout_agrees(torch.bfloat16),
                                        reason="this CPU's oneDNN has no bit-exact bf16 blocked matmul")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory, embedded_model_path):
    """A tiny Llama with an output layer tied to the embeddings (as SmolLM2), and a tiny Qwen2 (biases on q/k/v)."""
    extra = {"tie_word_embeddings": True} if request.param == "llama" else {}
    return make_tiny_model_dir(tmp_path_factory.mktemp(request.param), tokenizer_source=embedded_model_path,
                               model_type=request.param, num_layers=3, **extra)


def _load(model_dir: str, **kwargs) -> torch.nn.Module:
    """The tiny model in float32, with random projection biases where it has any (they load as zeros)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("_proj.bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model


def _padded_batch(vocabulary: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocabulary, (4, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding of unequal length, as the sampler batches turns
    mask[3, :2] = 0
    return ids, mask


def _steps_both_ways(copy, ids, mask, steps=6):
    """The copy's own forward and the fused step, each over its own cache from the same prefill, fed the same tokens;
    the logits of every step from both."""
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    caches = [growing_cache(copy, ids.size(1) + steps), growing_cache(copy, ids.size(1) + steps)]
    for cache in caches:
        copy(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    fused = FusedDecodeStep.for_model(copy)
    assert fused is not None
    generator = torch.Generator().manual_seed(1)
    pairs = []
    for _ in range(steps):
        tokens = torch.randint(5, copy.config.vocab_size, (ids.size(0), 1), generator=generator)
        positions = positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)
        theirs = copy(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=caches[0], use_cache=True,
                      logits_to_keep=1).logits[:, -1]
        pairs.append((theirs, fused(tokens, positions, mask, caches[1])))
    return pairs


def _lora_model(model_dir: str, **config):
    """The tiny model under LoRA adapters on every projection, with random A and B (PEFT's default starts B at zero,
    where the adapters would add nothing to check)."""
    from peft import LoraConfig, get_peft_model

    settings = dict(r=4, lora_alpha=8, lora_dropout=0.1, init_lora_weights=False,
                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(_load(model_dir), LoraConfig(**(settings | config)))


def _two_adapter_model(model_dir: str):
    """Two active adapters of other ranks, the second with a scaling (alpha / r = 1.5) whose products round."""
    from peft import LoraConfig

    model = _lora_model(model_dir)
    model.add_adapter("second", LoraConfig(r=2, lora_alpha=3, init_lora_weights=False,
                                           target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    model.base_model.set_adapter(["default", "second"])
    return model


@needs_blocked_bf16
@pytest.mark.parametrize("lora", [None, "one", "two"], ids=["plain", "lora", "two_adapters"])
def test_the_fused_step_gives_the_models_logits_bit_for_bit(model_dir, lora):
    model = {None: _load, "one": _lora_model, "two": _two_adapter_model}[lora](model_dir)
    copier = ComputeDtypeCopy(torch.bfloat16)
    copy = copier.of(model)
    ids, mask = _padded_batch(model.config.vocab_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        before = _steps_both_ways(copy, ids, mask)
        for theirs, ours in before:
            assert theirs.dtype == ours.dtype == torch.bfloat16
            assert torch.equal(theirs, ours)
        if lora:
            adapted = copy(input_ids=ids, attention_mask=mask).logits
            with copy.disable_adapter():  # the adapters change the logits compared above
                assert not torch.equal(copy(input_ids=ids, attention_mask=mask).logits, adapted)
        # A trained step moves the weights (under LoRA only the adapters): the copy refreshes, and the fused step
        # stacks its matrices again or uses the new adapters.
        layers = (model.get_base_model() if lora else model).model.layers
        if lora:
            layers[1].self_attn.v_proj.lora_B["default"].weight.mul_(3.0)
            layers[2].mlp.gate_proj.lora_A["default"].weight.mul_(-2.0)
        else:
            layers[1].self_attn.k_proj.weight.mul_(1.5)
            layers[2].mlp.up_proj.weight.mul_(-1.0)
        after = _steps_both_ways(copier.of(model), ids, mask, steps=2)
        for (theirs, ours), (old, _) in zip(after, before):
            assert torch.equal(theirs, ours) and not torch.equal(theirs, old)


@needs_blocked_bf16
def test_the_fused_step_follows_a_switch_of_active_adapters_between_calls(model_dir):
    copy = ComputeDtypeCopy(torch.bfloat16).of(_two_adapter_model(model_dir))
    ids, mask = _padded_batch(copy.config.vocab_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        both = _steps_both_ways(copy, ids, mask, steps=2)
        copy.base_model.set_adapter("default")
        one = _steps_both_ways(copy, ids, mask, steps=2)
    for theirs, ours in both + one:
        assert torch.equal(theirs, ours)
    assert not torch.equal(both[0][0], one[0][0])


@needs_blocked_bf16
def test_no_fused_step_where_it_would_bypass_the_models_forward(model_dir):
    model = _load(model_dir)
    assert FusedDecodeStep.for_model(model) is None  # float32 weights: no blocked layers to stack
    hooked = ComputeDtypeCopy(torch.bfloat16).of(model)
    hooked.model.layers[0].mlp.register_forward_hook(lambda module, args, out: out)
    assert FusedDecodeStep.for_model(hooked) is None
    eager = _load(model_dir, attn_implementation="eager")
    assert FusedDecodeStep.for_model(ComputeDtypeCopy(torch.bfloat16).of(eager)) is None
    assert FusedDecodeStep.for_model(ComputeDtypeCopy(torch.bfloat16).of(model)) is not None


@needs_blocked_bf16
def test_no_fused_step_for_lora_adapters_it_does_not_compute(tmp_path, embedded_model_path):
    model_dir = make_tiny_model_dir(tmp_path, tokenizer_source=embedded_model_path)
    copy = ComputeDtypeCopy(torch.bfloat16).of(_lora_model(model_dir))
    assert FusedDecodeStep.for_model(copy) is not None
    with copy.disable_adapter():
        assert FusedDecodeStep.for_model(copy) is None
    assert FusedDecodeStep.for_model(copy) is not None
    dora = ComputeDtypeCopy(torch.bfloat16).of(_lora_model(model_dir, use_dora=True))
    assert FusedDecodeStep.for_model(dora) is None
    copy.merge_adapter()
    assert FusedDecodeStep.for_model(copy) is None
