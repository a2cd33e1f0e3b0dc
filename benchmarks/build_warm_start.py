"""Rebuild the warm start the package ships (its adapter and fingerprint), or check a rebuild against it.

    python benchmarks/build_warm_start.py            # train and write taspo_trl/data/warm_starts/<name>/
    python benchmarks/build_warm_start.py --check    # train into a temp folder, compare with the shipped adapter
    python benchmarks/build_warm_start.py --revalidate   # after a code change that leaves the data as they were

The build is ``taspo_trl.warmstart.train_warm_start`` on the spec in ``WARM_STARTS`` (the one the package falls
back to when the shipped fingerprint does not match), under bf16 autocast where the hardware computes bf16
(``--bf16 true/false`` to choose). ``tests/package/test_warmstart.py`` fails while the shipped fingerprint is stale,
after a change to any module in ``warmstart._DATA_MODULES``. ``--revalidate`` then replays the demonstrations
(minutes, no training): where the rows a build would train on hash as the shipped record's ``data_sha256``, the
change left the weights as they were and the record takes today's code hash; otherwise it says to rebuild.

``--check`` prints the largest difference of any adapter tensor from the shipped one, relative to that tensor's
largest entry, and fails above ``--tolerance`` or where the rows it trained on hash otherwise than the shipped
build's; it records the result as ``check`` in ``benchmarks/results/warm_start_build.json`` (the results page). With the shipped precision, library versions and thread count
(``built_with`` in its ``warm_start.json``) a rebuild is bit for bit; other thread counts or CPUs reorder float
sums and move the adapter by a small fraction (docs/warm-start.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

from taspo_trl.precision import choose_precision
from taspo_trl.provenance import provenance, source_commit
from taspo_trl.warmstart import (
    WARM_STARTS,
    build_environment,
    fingerprint,
    revalidate_shipped,
    shipped_warm_start_dir,
    train_warm_start,
)

NAME = "embedded:smollm2-135m-alfworld"
TIMING = Path(__file__).parent / "results" / "warm_start_build.json"  # what the results page shows of a build
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def build(name: str, out: Path, bf16: bool | None) -> dict:
    """Train warm start ``name`` and write its adapter and ``warm_start.json`` to ``out``; returns the record."""
    spec = WARM_STARTS[name]
    if not spec.adapter_rank:
        raise SystemExit(f"{name} ships no adapter (lora_rank and delta_rank are 0): it is built on first use")
    import torch

    precision = choose_precision(bf16, use_cpu=not torch.cuda.is_available())
    print(f"building {name} in {precision.description}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="warm-start-build-") as work:
        adapter = Path(work) / "adapter"
        examples, rows_hash = train_warm_start(spec, Path(work) / "model", Path(work) / "games",
                                               bf16=precision.bf16, adapter_dir=adapter)
        out.mkdir(parents=True, exist_ok=True)
        for file in ADAPTER_FILES:
            shutil.copyfile(adapter / file, out / file)
    record = {"name": name, "fingerprint": fingerprint(spec), "examples": examples,
              "build_seconds": round(time.perf_counter() - started, 1), "built_with": build_environment(precision.bf16),
              "data_sha256": rows_hash}
    (out / "warm_start.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def compare(shipped: Path, rebuilt: Path) -> float:
    """Largest per-tensor difference between two adapters, relative to the shipped tensor's largest entry."""
    ours, theirs = load_file(str(shipped / ADAPTER_FILES[0])), load_file(str(rebuilt / ADAPTER_FILES[0]))
    if ours.keys() != theirs.keys():
        raise SystemExit(f"the rebuilt adapter has other tensors: {sorted(ours.keys() ^ theirs.keys())[:4]}")
    worst = 0.0
    for key, value in ours.items():
        scale = value.float().abs().max().item() or 1.0
        worst = max(worst, (value.float() - theirs[key].float()).abs().max().item() / scale)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default=NAME)
    parser.add_argument("--bf16", choices=("true", "false"), default=None,
                        help="build precision (default: bf16 where the hardware computes it)")
    parser.add_argument("--check", action="store_true", help="rebuild into a temp folder and compare")
    parser.add_argument("--revalidate", action="store_true",
                        help="keep the shipped adapter over a code change that leaves its training data unchanged")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="largest relative difference --check accepts (0: bit for bit)")
    args = parser.parse_args()
    bf16 = None if args.bf16 is None else args.bf16 == "true"
    shipped = shipped_warm_start_dir(args.name)
    if args.revalidate:
        try:
            print(revalidate_shipped(args.name, shipped), flush=True)
        except ValueError as problem:
            raise SystemExit(str(problem)) from None
        return
    commit = source_commit(__file__)
    if not args.check:
        record = build(args.name, shipped, bf16)
        size = (shipped / ADAPTER_FILES[0]).stat().st_size / 1e6
        print(f"wrote {shipped} ({size:.1f} MB adapter) in {record['build_seconds']:.0f}s", flush=True)
        max_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        TIMING.write_text(json.dumps({
            "name": args.name, "examples": record["examples"], "build_seconds": record["build_seconds"],
            "max_rss_gb": round(max_rss_gb, 1), "built_with": record["built_with"],
            "provenance": provenance(None, __file__, commit=commit)}, indent=2) + "\n")
        return
    with tempfile.TemporaryDirectory(prefix="warm-start-check-") as folder:
        record = build(args.name, Path(folder), bf16)
        difference = compare(shipped, Path(folder))
    shipped_record = json.loads((shipped / "warm_start.json").read_text())
    same_data = record["data_sha256"] == shipped_record.get("data_sha256")
    print(f"rebuilt in {record['build_seconds']:.0f}s; training data {'the same as' if same_data else 'OTHER than'} "
          f"the shipped build's; largest relative difference from the shipped adapter {difference:.3g} "
          f"(tolerance {args.tolerance:g})", flush=True)
    if args.name == NAME and TIMING.exists():  # the results page shows the last check beside the build
        timing = json.loads(TIMING.read_text())
        timing["check"] = {"rebuild_seconds": record["build_seconds"], "same_data": same_data,
                           "largest_relative_difference": difference, "tolerance": args.tolerance,
                           "built_with": record["built_with"], "provenance": provenance(None, __file__, commit=commit)}
        TIMING.write_text(json.dumps(timing, indent=2) + "\n")
    if difference > args.tolerance or not same_data:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
