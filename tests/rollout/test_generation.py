"""The CPU sampler's speed-ups: a KV cache written in place instead of concatenated, a copy of the model whose linear
weights are already in the autocast dtype (kept in step with the trained weights), and a decode loop of its own. With
``generate``'s draw they sample what ``generate`` sampled before them, bit for bit; their own draw is an exact draw
from the same distribution with other random numbers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from taspo_trl.rollout.chat import ChatFormat
from taspo_trl.rollout.decode_step import FusedDecodeStep, _blocked_layout_agrees
from taspo_trl.rollout.generation import ComputeDtypeCopy, TransformersGenerator, growing_cache, sample_rows
from taspo_trl.testing import make_tiny_model_dir


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory, embedded_model_path):
    """The embedded model's shape in small: an output layer tied to the embeddings, as SmolLM2 has."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tied"), tokenizer_source=embedded_model_path,
                               tie_word_embeddings=True)


@pytest.fixture(scope="module")
def chat(embedded_tokenizer):
    return ChatFormat(embedded_tokenizer)


def _prompts(chat):
    return [chat.first_prompt_ids("open the locker"), chat.first_prompt_ids("a longer prompt with more words in it"),
            chat.first_prompt_ids("go")]


def _sample(generator, prompts, seed=0):
    torch.manual_seed(seed)
    return [(g.token_ids, g.logprobs, g.stopped) for g in generator(prompts)]


def _as_before(generator, monkeypatch):
    """The sampler as it ran before these speed-ups: ``generate`` with its own cache, autocast over the float32
    weights."""
    import taspo_trl.rollout.generation as generation

    monkeypatch.setattr(generation, "growing_cache", lambda model, capacity: None)
    generator.compute_copy = None
    return generator


def _drawing_as_generate(monkeypatch):
    """The sampler's own loop with ``generate``'s draw (``torch.multinomial``) in place of ``sample_rows``."""
    import taspo_trl.rollout.generation as generation

    monkeypatch.setattr(generation, "sample_rows", lambda probs: torch.multinomial(probs, num_samples=1).squeeze(1))


def _peaked(model):
    """Output logits 8 times as spread as the random model's near-uniform ones (its first step's top token then has
    about a fifth of the mass): a temperature, a top-k or a top-p then changes which tokens a seed draws."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7), dict(temperature=1.0, top_k=5),
            dict(temperature=1.0, top_p=0.6), dict(temperature=1.3, top_k=40, top_p=0.7), dict(temperature=0.0)]


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
@pytest.mark.parametrize("settings", SETTINGS, ids=["plain", "cool", "top-k", "top-p", "all-three", "greedy"])
def test_with_generates_draw_the_same_seed_samples_what_the_sampler_before_sampled(tied_model_dir, chat, monkeypatch,
                                                                                   autocast, settings):
    """The own loop, the in-place cache and the compute-dtype copy together, against ``generate`` as it sampled
    before them: the same tokens, recorded log-probs and stops, bit for bit, once both draw with
    ``torch.multinomial``."""
    model = _peaked(AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32))
    _drawing_as_generate(monkeypatch)
    fast = TransformersGenerator(model, chat.tokenizer, max_new_tokens=24, autocast_dtype=autocast, **settings)
    decoded, fused = [], []
    monkeypatch.setattr(fast, "_decode", lambda *args: decoded.append(1) or TransformersGenerator._decode(fast, *args))
    step = FusedDecodeStep.__call__
    monkeypatch.setattr(FusedDecodeStep, "__call__", lambda *args: fused.append(1) or step(*args))
    now = _sample(fast, _prompts(chat))
    assert decoded  # the own loop sampled these
    assert bool(fused) == (autocast is not None and _blocked_layout_agrees(autocast))  # and the fused step, where it can
    before = _sample(_as_before(TransformersGenerator(model, chat.tokenizer, max_new_tokens=24, autocast_dtype=autocast,
                                                      generation_kwargs={"min_p": 0.0}, **settings), monkeypatch),
                     _prompts(chat))  # min_p 0 changes no sample but keeps this one in generate
    assert now == before
    assert sum(len(tokens) for tokens, _, _ in now) > 24  # several rows sampled well past their prompts


def test_a_seed_draws_other_tokens_than_generate_from_the_same_distributions(tied_model_dir, chat):
    """With ``sample_rows`` the tokens differ from ``generate``'s for a seed, while every recorded log-prob is still
    the policy's own at the prefix sampled (a fresh forward of prompt and response)."""
    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    own = TransformersGenerator(model, chat.tokenizer, max_new_tokens=16, temperature=1.0)
    through_generate = TransformersGenerator(model, chat.tokenizer, max_new_tokens=16, temperature=1.0,
                                             generation_kwargs={"min_p": 0.0})
    assert not through_generate._decodes_itself(model)
    assert _sample(own, _prompts(chat)) != _sample(through_generate, _prompts(chat))
    prompt = chat.first_prompt_ids("open the locker")
    torch.manual_seed(1)
    [gen] = own([prompt])
    with torch.no_grad():
        logits = model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1]
    fresh = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(gen.logprobs), fresh, atol=1e-4)


def test_settings_the_own_loop_does_not_apply_go_to_generate(tied_model_dir, chat):
    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    assert TransformersGenerator(model, chat.tokenizer)._decodes_itself(model)
    # TRL's default (GRPOConfig.repetition_penalty = 1.0): generate adds no processor for it
    for penalty, own_loop in ((1.0, True), (1.2, False)):
        generator = TransformersGenerator(model, chat.tokenizer, generation_kwargs={"repetition_penalty": penalty})
        assert generator._decodes_itself(model) is own_loop
    model.generation_config.repetition_penalty = 1.2  # a model that ships a penalty in its generation config
    assert not TransformersGenerator(model, chat.tokenizer)._decodes_itself(model)


def test_sample_rows_inverts_the_cumulative_distribution_by_hand(monkeypatch):
    """Weights [1, 0, 2.5, 1.5] (total 5): cumulative [1, 1, 3.5, 5]; a uniform u draws the first entry whose
    cumulative exceeds 5u, never the entry of weight 0."""
    weights = torch.tensor([[1.0, 0.0, 2.5, 1.5]] * 6)
    uniforms = torch.tensor([[0.0], [0.1999], [0.2], [0.6999], [0.7], [1 - 2**-53]], dtype=torch.float64)
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: uniforms)
    assert sample_rows(weights).tolist() == [0, 0, 2, 2, 3, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 10.0)), min_size=1, max_size=40).filter(lambda w: sum(w) > 0),
       st.integers(0, 2**31))
def test_sample_rows_never_draws_an_entry_of_weight_zero(weights, seed):
    torch.manual_seed(seed)
    drawn = sample_rows(torch.tensor([weights] * 64))
    assert all(weights[i] > 0 for i in drawn.tolist())


def test_sample_rows_draws_each_entry_at_its_probability():
    """400,000 draws from p = [0.5, 0.25, 0.15, 0.1, 0] (unnormalised): each frequency within 5 standard errors."""
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    draws = sample_rows((3 * p).expand(400_000, 5).contiguous())
    frequency = torch.bincount(draws, minlength=5).double() / draws.numel()
    standard_error = (p.double() * (1 - p.double()) / draws.numel()).sqrt()
    assert ((frequency - p.double()).abs() <= 5 * standard_error + 1e-12).all()


def test_the_growing_cache_outgrows_its_room_without_changing_a_sample(tied_model_dir, chat, monkeypatch):
    """Room for 3 positions only: the buffer grows (doubling) through the prompt and the response."""
    import taspo_trl.rollout.generation as generation

    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    generator = TransformersGenerator(model, chat.tokenizer, max_new_tokens=16, temperature=1.0)
    roomy = _sample(generator, _prompts(chat))
    made = []
    monkeypatch.setattr(generation, "growing_cache", lambda m, capacity: made.append(growing_cache(m, 3)) or made[-1])
    assert _sample(generator, _prompts(chat)) == roomy
    layer = made[0].layers[0]
    assert layer.key_buffer.shape[-2] > 3 and layer.keys.data_ptr() == layer.key_buffer.data_ptr()


def _autocast_logits(model, ids):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return model(ids).logits.float()


def test_the_compute_dtype_copy_computes_what_autocast_computes_on_the_float32_model(tied_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    mirror = ComputeDtypeCopy(torch.bfloat16).of(model)
    linears = [m for m in mirror.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert mirror.model.embed_tokens.weight.dtype == torch.float32  # embeddings and norms as in the model
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the trained model is left alone
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    assert torch.equal(_autocast_logits(mirror, ids), _autocast_logits(model, ids))


@pytest.mark.parametrize(("fused", "lora"), [(False, False), (True, False), (True, True)])
def test_the_copy_follows_an_optimizer_step_and_a_resumed_checkpoint(tied_model_dir, chat, tmp_path, fused, lora,
                                                                     monkeypatch):
    """After a step, the next samples' recorded log-probs are those of the updated model (a fresh autocast
    forward); after loading a checkpoint's weights, those of the checkpoint. The fused AdamW (transformers' default
    ``adamw_torch_fused``) updates the weights without moving their version counters. With LoRA adapters (PEFT)
    only the adapters train."""
    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    fused_steps = []
    decode = FusedDecodeStep.__call__
    monkeypatch.setattr(FusedDecodeStep, "__call__", lambda step, *args: fused_steps.append(1) or decode(step, *args))
    generator = TransformersGenerator(model, chat.tokenizer, max_new_tokens=12, temperature=1.0,
                                      autocast_dtype=torch.bfloat16)
    prompt = chat.first_prompt_ids("open the locker")

    def recorded_against_fresh_forward():
        torch.manual_seed(0)
        [gen] = generator([prompt])
        ids = torch.tensor([prompt + gen.token_ids])
        logits = _autocast_logits(model, ids)[0, len(prompt) - 1 : -1]
        fresh = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)
        return (torch.tensor(gen.logprobs) - fresh).abs().max().item()

    assert recorded_against_fresh_forward() < 1e-2
    model.save_pretrained(tmp_path / "checkpoint")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, fused=fused)
    loss = model(torch.tensor([prompt]), labels=torch.tensor([prompt])).loss
    loss.backward()
    optimizer.step()
    assert recorded_against_fresh_forward() < 1e-2  # an lr of 0.05 moves log-probs by far more than that
    copy_after_step = generator.compute_copy.of(model)
    model.load_state_dict(saved)  # what resuming from the checkpoint does to the model's tensors
    assert recorded_against_fresh_forward() < 1e-2
    assert generator.compute_copy.of(model) is copy_after_step  # refreshed in place, not copied again
    assert bool(fused_steps) == _blocked_layout_agrees(torch.bfloat16)  # the samples came through the fused step


def test_a_stale_copy_would_be_caught(tied_model_dir, chat):
    """The check above can fail: without the refresh, a step's update does not reach the samples."""
    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    copier = ComputeDtypeCopy(torch.bfloat16)
    stale = copier.of(model)
    ids = torch.tensor([chat.first_prompt_ids("open the locker")])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    before_refresh = _autocast_logits(stale, ids)
    assert not torch.allclose(before_refresh, _autocast_logits(model, ids), atol=1e-2)
    assert torch.equal(_autocast_logits(copier.of(model), ids), _autocast_logits(model, ids))


def test_a_bf16_trainer_keeps_one_copy_for_sampling_and_scoring_with_the_same_numbers(tmp_path, tiny_model_dir,
                                                                                      monkeypatch):
    """The trainer's scoring passes (no grad, dropout off) run the sampler's copy, made once per run: their log-probs
    equal those of autocast over the trained float32 weights, bit for bit."""
    from tests.helpers.cpu_config import cpu_trainer_kwargs
    from datasets import Dataset
    from tests.helpers.toy_envs import locker_factory

    import taspo_trl.trainers.scoring as scoring_module
    from taspo_trl import AgentGRPOConfig, AgentGRPOTrainer, encode_task_prompt

    dataset = Dataset.from_list([{"prompt": encode_task_prompt({"target": 1 + k, "max_turns": 2})} for k in range(2)])
    config = AgentGRPOConfig(**cpu_trainer_kwargs(tmp_path / "out", max_completion_length=8, bf16=True))
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=dataset, env_factory=locker_factory)
    try:
        batch = trainer._generate_and_score_completions([dict(r) for r in dataset] * 4)
        copier = trainer._compute_dtype_copy
        assert copier is not None and copier._source() is trainer.model
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        with torch.no_grad():
            with_copy = trainer._snapshot_logprobs(ids, mask, keep)
            monkeypatch.setattr(scoring_module, "trainer_compute_copy", lambda trainer: None)
            without = trainer._snapshot_logprobs(ids, mask, keep)
        assert torch.equal(with_copy, without)
        assert trainer._compute_dtype_copy is copier  # one copy for the run
        with torch.no_grad():  # and those passes do run the copy (the trained model's forward is wrapped by
            copier._copy.get_output_embeddings().weight.zero_()  # Accelerate and TRL, closures over its weights)
            monkeypatch.undo()
            uniform = trainer._snapshot_logprobs(ids, mask, keep)
        vocabulary = trainer.model.config.vocab_size
        attended = mask[:, -keep:].bool()
        assert attended.any() and torch.allclose(uniform[attended], torch.tensor(-math.log(vocabulary)), atol=1e-4)
    finally:
        trainer.close()


def test_weights_loaded_as_new_tensors_make_a_new_copy(tied_model_dir, chat):
    """``load_state_dict(assign=True)`` puts new tensors in the model (their version counters start afresh)."""
    model = AutoModelForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    copier = ComputeDtypeCopy(torch.bfloat16)
    first = copier.of(model)
    moved = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(moved, assign=True)
    ids = torch.tensor([chat.first_prompt_ids("open the locker")])
    assert copier.of(model) is not first
    assert torch.equal(_autocast_logits(copier.of(model), ids), _autocast_logits(model, ids))
