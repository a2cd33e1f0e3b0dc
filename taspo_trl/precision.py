"""Which precision a run computes in: bf16 autocast where the hardware does bfloat16 arithmetic, float32 elsewhere.

Under bf16 autocast (float32 weights, bfloat16 matmuls) the embedded 135M model trains about 1.6x faster than in
float32 on a CPU with bfloat16 instructions (AVX512-BF16 or AMX; ``benchmarks/cpu_precision.py``). On a CPU
without them the same matmuls run through conversions, tens of times slower than float32. So an unset ``bf16``
(the CPU recipes leave it unset) follows the hardware, and an explicit ``bf16: true/false`` always wins.
``taspo-train``, ``taspo-eval``, the warm-start build and the benchmarks all decide through
:func:`choose_precision`, and their run header prints :attr:`Precision.description`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPU_BF16_ENV = "TASPO_TRL_CPU_BF16"
"""Set to 0 or 1 to override what ``/proc/cpuinfo`` says about this CPU's bfloat16 instructions (e.g. to run as a
CPU without them would)."""
CPUINFO = Path("/proc/cpuinfo")
"""Where the CPU's flags are read (a test points it at a fake one)."""
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


@dataclass(frozen=True)
class Precision:
    bf16: bool
    """Compute under bf16 autocast (else float32)."""
    reason: str
    """Why, for the run header."""

    @property
    def name(self) -> str:
        """"bf16 autocast" or "float32"."""
        return "bf16 autocast" if self.bf16 else "float32"

    @property
    def description(self) -> str:
        return f"{self.name} ({self.reason})"


def cpu_bf16_flags(cpuinfo: Path | None = None) -> list[str] | None:
    """This CPU's bfloat16 instruction flags (``avx512_bf16``, ``amx_bf16``) as ``/proc/cpuinfo`` lists them;
    ``None`` where the flags can't be read (not Linux, or a CPU that lists no ``flags`` line)."""
    try:
        text = (cpuinfo or CPUINFO).read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None
    return [flag for flag in _CPU_BF16_FLAGS if flag in flags]


def cpu_computes_bf16(cpuinfo: Path | None = None) -> bool | None:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX); ``None`` where its flags can't be read.
    ``$TASPO_TRL_CPU_BF16`` (0 or 1), when set, is the answer instead."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip().lower()
    if forced:
        if forced not in _TRUE + _FALSE:
            raise ValueError(f"{CPU_BF16_ENV}={forced!r}: set it to 1 or 0 (or unset it to read /proc/cpuinfo)")
        return forced in _TRUE
    flags = cpu_bf16_flags(cpuinfo)
    return None if flags is None else bool(flags)


def hardware_precision(use_cpu: bool = False, cpuinfo: Path | None = None) -> Precision:
    """bf16 where the device computes it natively: a CUDA GPU with bf16 support (unless ``use_cpu``), or a CPU with
    AVX512-BF16 or AMX; float32 otherwise."""
    import torch

    if not use_cpu and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        if torch.cuda.is_bf16_supported():
            return Precision(True, f"auto: {name} computes bfloat16")
        return Precision(False, f"auto: {name} has no bfloat16 support")
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    native = cpu_computes_bf16(cpuinfo)
    if forced:
        return Precision(bool(native), f"auto: {CPU_BF16_ENV}={forced}")
    if native:
        return Precision(True, f"auto: this CPU has {', '.join(cpu_bf16_flags(cpuinfo) or [])}")
    if native is None:
        return Precision(False, f"auto: {cpuinfo or CPUINFO} lists no CPU flags, so bfloat16 instructions can't be assumed")
    return Precision(False, "auto: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX)")


def choose_precision(requested: bool | None, use_cpu: bool = False, cpuinfo: Path | None = None) -> Precision:
    """``requested`` (an explicit ``bf16: true/false``) when given, else :func:`hardware_precision`. An explicit
    ``true`` on a CPU without bfloat16 instructions is honoured, and its reason says it is slow there."""
    import torch

    if requested is None:
        return hardware_precision(use_cpu, cpuinfo)
    on_cpu = use_cpu or not torch.cuda.is_available()
    if requested and on_cpu and cpu_computes_bf16(cpuinfo) is False:
        return Precision(True, "set by bf16: true; this CPU has no bfloat16 instructions, so bf16 is emulated and "
                               "slower than float32 here: pass --bf16 false")
    return Precision(bool(requested), f"set by bf16: {str(bool(requested)).lower()}")


def resolve_config_precision(config: Any) -> Precision:
    """Settle a TRL config's ``bf16`` before its ``__post_init__`` (which would turn an unset ``bf16`` into True):
    unset (and no ``fp16``) follows the hardware. Keeps the choice in ``config.precision`` for the run header."""
    if config.fp16 and config.bf16 is None:
        config.bf16 = False
    choice = choose_precision(config.bf16, use_cpu=bool(config.use_cpu))
    config.bf16 = choice.bf16
    config.precision = choice
    return choice
