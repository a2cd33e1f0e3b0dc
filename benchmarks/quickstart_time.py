"""The README's first command as a new user meets it: wall time, peak memory and the step lines it prints.

Runs ``taspo-train --config <recipe>`` in a subprocess from this checkout, with an empty model cache (its own
``TASPO_TRL_CACHE``, so the embedded model is converted and the shipped warm start merged on the way, as on a
fresh machine) and a fresh output folder, and records the wall time of the whole command, the peak resident memory
of the training process, the precision line and every ``[step ...]`` line. The same machine's pace varies (shared
hosts), so the matmul throughput of a prefill-shaped product in the compute dtype is measured just before the run
and recorded next to the wall time.

    python benchmarks/quickstart_time.py                               # the README's TASPO quickstart
    python benchmarks/quickstart_time.py --recipe alfworld_grpo_cpu --out outputs/quickstart_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers.hf_argparser import string_to_bool

from taspo_trl.precision import Precision, choose_precision
from taspo_trl.provenance import provenance, source_commit

from decode_pace import matmul_throughput  # this folder's
from taspo_trl.recipes import find_recipe

ROOT = Path(__file__).resolve().parents[1]


def run_quickstart(recipe: str, extra: list[str], work: Path) -> dict[str, Any]:
    """Run the recipe once in ``work`` (cache and outputs there) and return what it printed and cost."""
    env = {**os.environ, "TASPO_TRL_CACHE": str(work / "cache"), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "taspo_trl.cli", "--config", recipe, "--output_dir", str(work / "run"), *extra]
    if "games_dir" in (yaml.safe_load(Path(find_recipe(recipe)).read_text()) or {}):
        command += ["--games_dir", str(work / "games")]  # generated afresh, as on a new machine
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the quickstart failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    return {
        "seconds": round(seconds, 1),
        # ru_maxrss of the children is in kilobytes on Linux: the training process's peak
        "max_rss_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2, 2),
        "precision": next((line for line in lines if line.startswith("[taspo-train] precision:")), None),
        "step_lines": [line for line in lines if line.startswith("[step ")],
    }


def run_precision(extra: list[str]) -> Precision:
    """The precision ``taspo-train`` chooses for the run: the ``--bf16`` among ``extra`` (``--bf16``, ``--bf16 x``
    or ``--bf16=x``, read as its parser reads a bool), else what the CPU computes."""
    bf16 = argparse.ArgumentParser(add_help=False)
    bf16.add_argument("--bf16", nargs="?", const=True, type=string_to_bool, default=None)
    return choose_precision(bf16.parse_known_args(extra)[0].bf16, use_cpu=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/quickstart/alfworld_taspo_cpu.yaml")
    parser.add_argument("--out", default="outputs/quickstart_time.json")
    args, extra = parser.parse_known_args(argv)
    commit = source_commit(__file__)
    dtype = torch.bfloat16 if run_precision(extra).bf16 else torch.float32
    # 2,310 prompt tokens through SmolLM2-135M's MLP: the prefill's shape (decode_pace.py measures the same)
    pace = {"matmul_tflop_s": round(matmul_throughput(2310, 576, 1536, dtype), 3), "matmul_dtype": str(dtype)}
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        measured = run_quickstart(args.recipe, extra, Path(tmp))
    result = {"recipe": args.recipe, "extra_arguments": extra, **measured, **pace,
              "provenance": provenance(argv, __file__, commit=commit)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{measured['seconds']:.0f} s, max RSS {measured['max_rss_gb']:.1f} GB, matmul {pace['matmul_tflop_s']} "
          f"TFLOP/s before the run; {measured['precision']}")
    print("\n".join(measured["step_lines"]))
    return result


if __name__ == "__main__":
    main()
