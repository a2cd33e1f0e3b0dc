"""The warm-started policy cache: built on first use into place atomically, reused while its fingerprint
holds, rebuilt when a setting changes, and never left half-written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from taspo_trl import warmstart
from taspo_trl.warmstart import resolve_policy_path

NAME = "embedded:tiny-pick-and-place"


@pytest.fixture
def tiny_warm_start(monkeypatch, tmp_path, tiny_model_dir):
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    spec = warmstart.WarmStart(
        environment="alfworld", base_model=tiny_model_dir, games_per_type=1, games_seed=0, layout="turn",
        history_window=1, num_train_epochs=1, learning_rate=1e-3, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, seed=0, task_types=("pick_and_place_simple",),
    )
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, spec)
    return spec


def _record(path: str) -> dict:
    return json.loads((Path(path) / "warm_start.json").read_text())


def test_built_once_then_reused_then_rebuilt_when_a_setting_changes(tiny_warm_start, tiny_model_dir, monkeypatch):
    path = resolve_policy_path(NAME)
    assert Path(path) == warmstart.warm_start_dir(NAME) and Path(path).name == "tiny-pick-and-place"
    first = _record(path)
    # The pick-and-place walkthrough of seed 0 has five commands; the expert may first search up to two other
    # receptacles (a "go to" and an "open" each).
    assert 5 <= first["examples"] <= 9
    trained = AutoModelForCausalLM.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any((a - b).abs().max() > 0 for a, b in zip(trained.parameters(), base.parameters()))

    assert resolve_policy_path(NAME) == path and _record(path) == first  # reused: same record, no rebuild
    assert [p.name for p in Path(path).parent.iterdir() if not p.name.endswith(".lock")] == [Path(path).name]

    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(tiny_warm_start, learning_rate=2e-3))
    assert resolve_policy_path(NAME) == path
    second = _record(path)
    assert second["fingerprint"]["settings"]["learning_rate"] == 2e-3 != first["fingerprint"]["settings"]["learning_rate"]


def test_a_dagger_round_adds_one_correction_per_turn_of_a_policy_without_valid_actions(tiny_warm_start, monkeypatch):
    """The tiny random model writes no valid action, so in each of its sampled episodes the expert corrects every
    turn: 2 episodes of 3 turns add 6 rows to the demonstrations, and the second round changes the weights."""
    plain_path = resolve_policy_path(NAME)
    plain = _record(plain_path)["examples"]
    plain_weights = [p.detach().clone() for p in AutoModelForCausalLM.from_pretrained(plain_path).parameters()]
    dagger = replace(tiny_warm_start, relabel_episodes_per_task=2, relabel_max_turns=3, relabel_max_new_tokens=8)
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, dagger)
    path = resolve_policy_path(NAME)
    assert _record(path)["examples"] == plain + 6
    trained = AutoModelForCausalLM.from_pretrained(path)
    assert any((a - b).abs().max() > 0 for a, b in zip(trained.parameters(), plain_weights))


def test_a_failed_build_leaves_nothing_behind(tiny_warm_start, monkeypatch, tmp_path):
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(tiny_warm_start, base_model=str(tmp_path / "missing")))
    with pytest.raises(OSError):
        resolve_policy_path(NAME)
    models = warmstart.warm_start_dir(NAME).parent
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []


def test_agent_sft_trainer_gives_trls_loss_and_gradients(tiny_model_dir, embedded_tokenizer, tmp_path):
    """On a CPU the warm start's trainer scores only the response positions; the loss and every gradient must be
    those of TRL's own SFTTrainer on the same batch."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    from taspo_trl.envs.alfworld import generate_games, task_spec_rows
    from taspo_trl.trainers.sft import AgentSFTConfig, AgentSFTTrainer, demonstration_sft_dataset

    games = generate_games(tmp_path / "games", 1, 0, "train", task_types=["pick_and_place_simple"])
    tokenizer = embedded_tokenizer.__class__.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    config = AgentSFTConfig(output_dir=str(tmp_path / "out"), history_window=1, per_device_train_batch_size=5,
                            use_cpu=True, bf16=False, gradient_checkpointing=False, max_length=None, report_to="none")
    dataset = demonstration_sft_dataset(task_spec_rows(games), tokenizer, config)
    results = []
    for trainer_class in (SFTTrainer, AgentSFTTrainer):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        trainer = trainer_class(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
        batch = next(iter(trainer.get_train_dataloader()))
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]))
    (trl_loss, trl_grads), (our_loss, our_grads) = results
    assert our_loss == pytest.approx(trl_loss, abs=1e-6) and len(trl_grads) == len(our_grads) > 0
    for theirs, ours in zip(trl_grads, our_grads):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_frozen_layers_fix_the_bottom_and_leave_the_top_gradients_unchanged(tiny_model_dir, embedded_tokenizer, tmp_path):
    """Freezing the embeddings and the lowest layer must not change any gradient above it (backpropagation only
    stops earlier) and must leave the frozen weights with no gradient; with PEFT, the adapter's factors in the frozen
    layer get none either, and those above do."""
    import torch
    from peft import LoraConfig

    from taspo_trl.envs.alfworld import generate_games, task_spec_rows
    from taspo_trl.trainers.sft import AgentSFTConfig, AgentSFTTrainer, demonstration_sft_dataset

    games = generate_games(tmp_path / "games", 1, 0, "train", task_types=["pick_and_place_simple"])
    tokenizer = embedded_tokenizer.__class__.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    grads = []
    for frozen in (0, 1):
        config = AgentSFTConfig(output_dir=str(tmp_path / "out"), history_window=1, per_device_train_batch_size=5,
                                use_cpu=True, bf16=False, gradient_checkpointing=False, max_length=None,
                                report_to="none", frozen_layers=frozen)
        dataset = demonstration_sft_dataset(task_spec_rows(games), tokenizer, config)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        trainer = AgentSFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
        trainer.compute_loss(trainer.model, next(iter(trainer.get_train_dataloader()))).backward()
        grads.append({name: p.grad for name, p in trainer.model.named_parameters()})
    full, partial = grads
    frozen_names = [n for n in full if n.startswith(("model.embed_tokens", "model.layers.0.", "lm_head"))]
    assert frozen_names and all(partial[n] is None for n in frozen_names)
    upper = [n for n in full if n not in frozen_names]
    assert upper and all(partial[n] is not None for n in upper)
    for name in upper:
        torch.testing.assert_close(partial[name], full[name], atol=1e-6, rtol=1e-5)

    config = AgentSFTConfig(output_dir=str(tmp_path / "peft"), history_window=1, per_device_train_batch_size=5,
                            use_cpu=True, bf16=False, gradient_checkpointing=False, max_length=None,
                            report_to="none", frozen_layers=1)
    trainer = AgentSFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=config,
                              train_dataset=dataset, processing_class=tokenizer,
                              peft_config=LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainer.compute_loss(trainer.model, next(iter(trainer.get_train_dataloader()))).backward()
    factors = {name: p for name, p in trainer.model.named_parameters() if "lora_B" in name}
    lower = [name for name in factors if ".layers.0." in name]
    assert lower and len(lower) < len(factors)
    for name, parameter in factors.items():
        assert (parameter.grad is None) is (name in lower), name


def test_benchmarks_prompt_a_warm_start_with_the_window_it_was_trained_on(tmp_path):
    """credit_quality.py and pi_specificity.py read the window from warm_start.json (the trainer's default window
    is 3, the embedded warm start's 1); any other model gets the quickstarts' 1."""
    built = tmp_path / "built"
    built.mkdir()
    (built / "warm_start.json").write_text(json.dumps({"fingerprint": {"settings": {"history_window": 2}}}))
    assert warmstart.trained_history_window(str(built)) == 2
    assert warmstart.trained_history_window(str(tmp_path)) == 1
    assert warmstart.WARM_STARTS["embedded:smollm2-135m-alfworld"].history_window == 1


def test_the_shipped_warm_start_matches_its_code_and_settings():
    """A warm start with an adapter (LoRA, or a full fine-tune's update truncated to ``delta_rank``) ships it,
    built from today's data-producing code and settings (after a change to any module of
    ``warmstart._DATA_MODULES`` or to the spec, rebuild it with ``python benchmarks/build_warm_start.py``); one
    without is built on first use and ships nothing."""
    from safetensors import safe_open

    for name, spec in warmstart.WARM_STARTS.items():
        shipped = warmstart.shipped_warm_start_dir(name)
        assert shipped.is_dir() is bool(spec.adapter_rank), name
        if not spec.adapter_rank:
            continue
        record = _record(str(shipped))
        assert record["fingerprint"] == warmstart.fingerprint(spec), (
            "the shipped warm start is stale: python benchmarks/build_warm_start.py --revalidate (same data), "
            "else rebuild it with python benchmarks/build_warm_start.py")
        assert len(record.get("data_sha256", "")) == 64  # what --revalidate compares with
        adapter = shipped / "adapter_model.safetensors"
        assert adapter.stat().st_size <= 20e6  # small enough for the wheel
        config = json.loads((shipped / "adapter_config.json").read_text())
        alpha = spec.lora_alpha if spec.lora_rank else spec.delta_rank  # a truncated update is applied at scale 1
        assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (
            spec.adapter_rank, alpha, spec.base_model)
        with safe_open(str(adapter), "pt") as tensors:
            dtypes = {key: tensors.get_slice(key).get_dtype() for key in tensors.keys()}
        assert {dtype for key, dtype in dtypes.items() if "lora_" in key} == {"F16"}
        assert {dtype for key, dtype in dtypes.items() if "lora_" not in key} <= {"F32"}  # trained norms, whole


def test_truncated_update_keeps_the_largest_singular_directions():
    """Eckart-Young on a matrix built from known singular values 3, 2 and 0.5: rank 2 keeps exactly the first two
    components (error 0.5 in Frobenius norm), each factor carries the square roots of the kept values, and the
    largest entry of each column of B is positive, whatever sign the SVD routine picked."""
    import torch

    generator = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(7, 3, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(5, 3, generator=generator, dtype=torch.float64))
    update = (u * torch.tensor([3.0, 2.0, 0.5], dtype=torch.float64)) @ v.T
    b, a = warmstart.truncated_update(update.float(), 2)
    expected = (u[:, :2] * torch.tensor([3.0, 2.0], dtype=torch.float64)) @ v[:, :2].T
    torch.testing.assert_close((b @ a).double(), expected, atol=1e-5, rtol=0)
    assert torch.linalg.norm((b @ a).double() - update).item() == pytest.approx(0.5, abs=1e-5)
    torch.testing.assert_close((b.T @ b).double(), torch.diag(torch.tensor([3.0, 2.0], dtype=torch.float64)), atol=1e-5, rtol=0)
    torch.testing.assert_close((a @ a.T).double(), torch.diag(torch.tensor([3.0, 2.0], dtype=torch.float64)), atol=1e-5, rtol=0)
    assert (b.gather(0, b.abs().argmax(dim=0, keepdim=True)) > 0).all()
    flipped_b, flipped_a = warmstart.truncated_update(-update.float(), 2)  # the same directions, opposite sign
    torch.testing.assert_close(flipped_b @ flipped_a, -(b @ a), atol=1e-5, rtol=0)
    assert (flipped_b.gather(0, flipped_b.abs().argmax(dim=0, keepdim=True)) > 0).all()
    wide_b, wide_a = warmstart.truncated_update(update.float(), 6)  # past the narrow side (5): whole, zeros after
    assert wide_b.shape == (7, 6) and wide_a.shape == (6, 5) and not wide_b[:, 5].any() and not wide_a[5].any()
    torch.testing.assert_close(wide_b @ wide_a, update.float(), atol=1e-5, rtol=0)


def test_a_delta_rank_warm_start_is_the_fine_tune_with_each_linear_update_truncated(tiny_warm_start, tiny_model_dir):
    """A full fine-tune (embeddings and the lowest layer fixed) kept to rank 1: every trained linear layer moves by
    a rank-1 matrix, the best rank-1 approximation of the full fine-tune's own update (up to the adapter's float16
    rounding), the trained norms are the fine-tune's exactly, and the fixed layer and embeddings are the base's."""
    import torch

    full = replace(tiny_warm_start, frozen_layers=1)
    tiny_full = "embedded:tiny-full"
    warmstart.WARM_STARTS[tiny_full] = full
    truncated = replace(full, delta_rank=1)
    warmstart.WARM_STARTS[NAME] = truncated
    try:
        tuned = dict(AutoModelForCausalLM.from_pretrained(resolve_policy_path(tiny_full, bf16=False)).named_parameters())
        kept = dict(AutoModelForCausalLM.from_pretrained(resolve_policy_path(NAME, bf16=False)).named_parameters())
    finally:
        del warmstart.WARM_STARTS[tiny_full]
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    moved_linear = 0
    for name, weight in base.items():
        if "layers.0." in name or "embed_tokens" in name:
            torch.testing.assert_close(kept[name], weight, rtol=0, atol=0)
        elif weight.dim() == 1:  # a norm: saved whole, in float32
            assert (tuned[name] != weight).any(), name
            torch.testing.assert_close(kept[name], tuned[name], rtol=0, atol=0)
        else:
            update, full_update = kept[name] - weight, tuned[name] - weight
            assert torch.linalg.matrix_rank(update, atol=1e-6).item() == 1, name
            u, s, vh = torch.linalg.svd(full_update.double())
            best = s[0] * torch.outer(u[:, 0], vh[0])
            torch.testing.assert_close(update.double(), best, atol=2e-3 * best.abs().max().item(), rtol=0)
            moved_linear += 1
    assert moved_linear == 7  # q, k, v, o, gate, up, down of the one trained layer


def test_healing_trains_the_truncated_update_further_at_the_same_rank(tiny_warm_start, tiny_model_dir, monkeypatch):
    """``heal_epochs`` trains the rank-1 truncation as a rank-1 adapter: every trained linear layer still moves by
    a rank-1 matrix, but not by the plain truncation's (the heal moved it), and the fixed layer stays the base's.
    Healing needs a truncation to heal."""
    import torch

    truncated = replace(tiny_warm_start, frozen_layers=1, delta_rank=1)
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, truncated)
    plain = dict(AutoModelForCausalLM.from_pretrained(resolve_policy_path(NAME, bf16=False)).named_parameters())
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(truncated, heal_epochs=1, heal_learning_rate=1e-2))
    healed = dict(AutoModelForCausalLM.from_pretrained(resolve_policy_path(NAME, bf16=False)).named_parameters())
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    moved = 0
    for name, weight in base.items():
        if "layers.0." in name or "embed_tokens" in name:
            torch.testing.assert_close(healed[name], weight, rtol=0, atol=0)
        elif weight.dim() == 2:
            assert torch.linalg.matrix_rank(healed[name] - weight, atol=1e-6).item() == 1, name
            moved += int((healed[name] - plain[name]).abs().max().item() > 1e-4)
    assert moved == 7
    with pytest.raises(ValueError, match="set delta_rank > 0"):
        replace(tiny_warm_start, heal_epochs=1)


@pytest.mark.parametrize("adapter", [dict(lora_rank=4, lora_alpha=8), dict(delta_rank=2, frozen_layers=1)],
                         ids=["lora", "truncated-full-fine-tune"])
def test_a_matching_shipped_adapter_is_installed_without_training(adapter, tiny_warm_start, tiny_model_dir, monkeypatch,
                                                                   tmp_path):
    """A warm start with an adapter built once (as ``benchmarks/build_warm_start.py`` builds the shipped one)
    installs into an empty cache from its adapter alone, with the weights the build gave; a changed setting falls
    back to a build."""
    import torch

    lora = replace(tiny_warm_start, **adapter)
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, lora)
    built = Path(resolve_policy_path(NAME, bf16=False))
    shipped = tmp_path / "package" / "tiny-pick-and-place"
    shipped.mkdir(parents=True)
    # What the rebuild script ships: the build's adapter and record (a build leaves them in its work folder, so
    # rebuild them here through the same functions).
    trained = AutoModelForCausalLM.from_pretrained(built)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any((a - b).abs().max() > 0 for a, b in zip(trained.parameters(), base.parameters()))
    examples, rows_hash = warmstart.train_warm_start(lora, tmp_path / "model", tmp_path / "games", bf16=False,
                                                     adapter_dir=shipped)
    assert rows_hash == warmstart.data_sha256(lora)  # the rows it trained on are the ones a replay plays again
    (shipped / "warm_start.json").write_text(json.dumps({"name": NAME, "fingerprint": warmstart.fingerprint(lora),
                                                          "examples": examples}))
    monkeypatch.setattr(warmstart, "_SHIPPED", tmp_path / "package")
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "fresh-cache"))

    def no_training(*args, **kwargs):
        raise AssertionError("a matching shipped adapter must not be retrained")

    monkeypatch.setattr(warmstart, "train_warm_start", no_training)
    installed = Path(resolve_policy_path(NAME))
    assert _record(str(installed))["installed_from"] == "package"
    for ours, theirs in zip(AutoModelForCausalLM.from_pretrained(installed).parameters(), trained.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)  # same seed, same code: the same weights
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(lora, learning_rate=2e-3))
    with pytest.raises(AssertionError, match="must not be retrained"):
        resolve_policy_path(NAME)  # the shipped fingerprint no longer matches: a build, not an install


def test_revalidate_keeps_the_shipped_adapter_only_while_the_training_data_stay_the_same(tiny_warm_start, tmp_path,
                                                                                         monkeypatch):
    """A refactor of a data-producing module changes the code hash, not the rows a build trains on: the shipped
    record then takes today's code hash. A change that does alter the rows (here the expert's thought on every
    move) needs a rebuild, and the record stays as it was."""
    import shutil

    import taspo_trl.envs.alfworld as alfworld
    from taspo_trl.envs.alfworld.expert import ALFWorldExpert

    generate, generated = alfworld.generate_games, {}

    def generate_once(out, *args, **kwargs):  # the same seeded games each time; the engine takes seconds a game
        key = repr((args, kwargs))
        if key not in generated:
            folder = tmp_path / f"games-{len(generated)}"
            generated[key] = folder, generate(folder, *args, **kwargs)
        folder, files = generated[key]
        shutil.copytree(folder, out, dirs_exist_ok=True)
        return [Path(out) / Path(file).relative_to(folder) for file in files]

    monkeypatch.setattr(alfworld, "generate_games", generate_once)
    data = warmstart.data_sha256(tiny_warm_start)  # revalidate's own hash below must equal it: seeded, stable
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    older_code = {**warmstart.fingerprint(tiny_warm_start), "code_sha256": "0" * 64}
    (shipped / "warm_start.json").write_text(json.dumps({"name": NAME, "fingerprint": older_code, "data_sha256": data}))

    assert "takes today's code hash" in warmstart.revalidate_shipped(NAME, shipped)
    assert _record(str(shipped))["fingerprint"] == warmstart.fingerprint(tiny_warm_start)
    assert "nothing to do" in warmstart.revalidate_shipped(NAME, shipped)

    (shipped / "warm_start.json").write_text(json.dumps({"name": NAME, "fingerprint": older_code, "data_sha256": data}))
    monkeypatch.setattr(ALFWorldExpert, "_go", staticmethod(lambda recep, thought: (f"{thought} Onward.", f"go to {recep}")))
    with pytest.raises(ValueError, match="changes its training data"):
        warmstart.revalidate_shipped(NAME, shipped)
    assert _record(str(shipped))["fingerprint"] == older_code
    monkeypatch.setitem(warmstart.WARM_STARTS, NAME, replace(tiny_warm_start, learning_rate=2e-3))
    with pytest.raises(ValueError, match="settings or build version changed"):
        warmstart.revalidate_shipped(NAME, shipped)
