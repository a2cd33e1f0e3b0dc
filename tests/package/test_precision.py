"""Precision follows the hardware unless the user says otherwise: bf16 autocast on a CPU whose /proc/cpuinfo lists
AVX512-BF16 or AMX, float32 on one without, an explicit ``--bf16 true/false`` always, and the same choice reaches
the run header, the configs TRL builds its accelerator from, and a warm-start build. Fake /proc/cpuinfo files of
both kinds of CPU; the CUDA branch is not exercised (no GPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taspo_trl import precision, warmstart
from taspo_trl.cli import build_trainer
from taspo_trl.envs.alfworld import generate_games
from taspo_trl.precision import CPU_BF16_ENV, choose_precision, cpu_computes_bf16, hardware_precision

# Flags of the two kinds of CPU the issue names: an AVX2 EPYC without AVX-512, and an EPYC with AVX512-BF16.
AVX2_FLAGS = "fpu vme de pse tsc msr pae mce sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2"
BF16_FLAGS = AVX2_FLAGS + " avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512vnni"


def _cpuinfo(path: Path, flags: str) -> Path:
    path.write_text("".join(f"processor\t: {i}\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\n" for i in range(2)))
    return path


@pytest.fixture
def fake_cpu(tmp_path, monkeypatch):
    """Point the hardware check at a fake /proc/cpuinfo with the given flags (and no override in the env)."""
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)

    def use(flags: str) -> Path:
        path = _cpuinfo(tmp_path / f"cpuinfo-{len(flags)}", flags)
        monkeypatch.setattr(precision, "CPUINFO", path)
        return path

    return use


@pytest.mark.parametrize(("flags", "expected"), [
    ("fpu sse2 avx2 fma avx512f avx512bw", False),  # AVX-512 without its bf16 extension
    ("fpu sse2 avx2 avx512f avx512_bf16", True),
    ("fpu sse2 avx2 amx_bf16 amx_tile", True),
])
def test_cpu_bf16_instructions_are_read_from_the_flags(tmp_path, monkeypatch, flags, expected):
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert cpu_computes_bf16(_cpuinfo(tmp_path / "cpuinfo", flags)) is expected


def test_cpu_bf16_is_unknown_without_flags(tmp_path, monkeypatch):
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert cpu_computes_bf16(tmp_path / "missing") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert cpu_computes_bf16(tmp_path / "arm") is None
    assert hardware_precision(use_cpu=True, cpuinfo=tmp_path / "arm").bf16 is False  # not assumed


def test_unset_bf16_follows_the_cpu_flags(fake_cpu):
    fake_cpu(AVX2_FLAGS)
    plain = choose_precision(None, use_cpu=True)
    assert plain.bf16 is False
    assert plain.description == "float32 (auto: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX))"
    fake_cpu(BF16_FLAGS)
    native = choose_precision(None, use_cpu=True)
    assert native.bf16 is True and native.description == "bf16 autocast (auto: this CPU has avx512_bf16)"


def test_an_explicit_bf16_wins_and_says_when_it_is_emulated(fake_cpu):
    fake_cpu(BF16_FLAGS)
    assert choose_precision(False, use_cpu=True).description == "float32 (set by bf16: false)"
    fake_cpu(AVX2_FLAGS)
    emulated = choose_precision(True, use_cpu=True)
    assert emulated.bf16 is True and "emulated" in emulated.reason and "pass --bf16 false" in emulated.reason


def test_the_environment_overrides_the_flags(fake_cpu, monkeypatch):
    fake_cpu(BF16_FLAGS)
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert choose_precision(None, use_cpu=True).description == f"float32 (auto: {CPU_BF16_ENV}=0)"
    fake_cpu(AVX2_FLAGS)
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert choose_precision(None, use_cpu=True).bf16 is True
    monkeypatch.setenv(CPU_BF16_ENV, "maybe")
    with pytest.raises(ValueError, match="set it to 1 or 0"):
        choose_precision(None, use_cpu=True)


@pytest.mark.parametrize("config_class", ["AgentGRPOConfig", "AgentSFTConfig"])
def test_configs_resolve_an_unset_bf16_before_trl_makes_it_true(fake_cpu, config_class, tmp_path):
    """TRL turns an unset ``bf16`` into True; ours ask the hardware first, and TRL's mixed precision (what the
    accelerator autocasts to) follows."""
    from taspo_trl.trainers import AgentGRPOConfig
    from taspo_trl.trainers.sft import AgentSFTConfig

    cls = {"AgentGRPOConfig": AgentGRPOConfig, "AgentSFTConfig": AgentSFTConfig}[config_class]
    settings = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": "none"}
    if cls is AgentGRPOConfig:
        settings.update(num_generations=2, per_device_train_batch_size=2)
    fake_cpu(AVX2_FLAGS)
    plain = cls(**settings)
    assert (plain.bf16, plain.mixed_precision) == (False, "no")
    fake_cpu(BF16_FLAGS)
    native = cls(**settings)
    assert (native.bf16, native.mixed_precision) == (True, "bf16")
    assert cls(**settings, bf16=False).bf16 is False


@pytest.fixture(scope="module")
def one_game(tmp_path_factory) -> Path:
    """Two games: one generation batch of the quickstart (per_device 1 x 8 accumulation / 4 siblings)."""
    out = tmp_path_factory.mktemp("precision_games")
    generate_games(out, per_type=1, seed=0, split="train", task_types=["pick_and_place_simple", "look_at_obj_in_light"])
    return out


def _quickstart(tmp_path: Path, games: Path, *extra: str) -> list[str]:
    return ["--config", "alfworld_taspo_cpu", "--output_dir", str(tmp_path / "out"), "--games_dir", str(games),
            "--max_tasks", "2", "--report_to", "none", *extra]


@pytest.mark.parametrize(("flags", "header"), [
    (AVX2_FLAGS, "[taspo-train] precision: float32 (auto: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX))"),
    (BF16_FLAGS, "[taspo-train] precision: bf16 autocast (auto: this CPU has avx512_bf16)"),
])
def test_the_quickstart_header_says_which_precision_runs_and_why(fake_cpu, capsys, tmp_path, one_game, tiny_model_dir,
                                                                 flags, header):
    fake_cpu(flags)
    trainer = build_trainer(_quickstart(tmp_path, one_game), model_override=tiny_model_dir)
    try:
        assert header in capsys.readouterr().out.splitlines()
        assert trainer.args.bf16 is (flags == BF16_FLAGS)
        assert trainer.accelerator.mixed_precision == ("bf16" if flags == BF16_FLAGS else "no")
    finally:
        trainer.close()


class _BuildStarted(Exception):
    pass


@pytest.mark.parametrize(("flags", "extra", "built_in_bf16"), [
    (BF16_FLAGS, ["--bf16", "false"], False),  # the user's choice, on a CPU that could do bf16
    (AVX2_FLAGS, [], False),  # the hardware's choice
    (AVX2_FLAGS, ["--bf16", "true"], True),  # the user's choice, slow as it is there
])
def test_the_run_precision_reaches_the_warm_start_build(fake_cpu, monkeypatch, tmp_path, one_game, flags, extra,
                                                        built_in_bf16):
    """With no shipped adapter and an empty cache, the warm start of the quickstart is built in the run's precision."""
    fake_cpu(flags)
    monkeypatch.setenv("TASPO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(warmstart, "_SHIPPED", tmp_path / "nothing-shipped")
    seen = []

    def train(spec, out_dir, games_dir, bf16=False, adapter_dir=None):
        seen.append(bf16)
        raise _BuildStarted

    monkeypatch.setattr(warmstart, "train_warm_start", train)
    with pytest.raises(_BuildStarted):
        build_trainer(_quickstart(tmp_path, one_game, *extra))
    assert seen == [built_in_bf16]
