"""Where a benchmark result came from: the date, the commit, the machine's CPU and the command, recorded in the
result's JSON next to the figures, so the documentation's results page states them without anyone typing them."""

from __future__ import annotations

import datetime
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

# The CPU features that decide how fast float32 and bf16 autocast run (see docs/troubleshooting.md).
PRECISION_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """The installed version of each distribution in ``names`` (``None`` where it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cpu(cpuinfo: str) -> tuple[str, list[str]]:
    model, flags = "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, [flag for flag in PRECISION_FLAGS if flag in flags]


def source_commit(script: str) -> str | None:
    """The commit of the checkout holding ``script`` (``-dirty`` when tracked files differ from it), or ``None``
    outside git. A long benchmark reads it when it starts: the code that ran, even if HEAD moves before it ends."""
    return _commit(Path(script).resolve().parent)


def _commit(repo: Path) -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def provenance(argv: list[str] | None, script: str, cpuinfo_path: str = "/proc/cpuinfo",
               commit: str | None = None) -> dict[str, Any]:
    """The ``provenance`` block of a result: ``script`` is the benchmark's file, ``argv`` its arguments
    (``None``: this process's own), ``commit`` the one :func:`source_commit` read when the run started (``None``:
    read it now)."""
    try:
        cpu_model, cpu_flags = _cpu(Path(cpuinfo_path).read_text())
    except OSError:
        cpu_model, cpu_flags = "unknown", []
    arguments = sys.argv[1:] if argv is None else list(argv)
    script_path = Path(script).resolve()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or _commit(script_path.parent),
        "cpu_model": cpu_model,
        "cpu_flags": cpu_flags,
        "command": " ".join(["python", f"benchmarks/{script_path.name}", *arguments]),
    }
