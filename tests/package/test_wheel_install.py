"""The wheel is enough: built from this checkout and installed into a fresh virtual environment, it carries the
recipes and accelerate configs, and ``taspo-train --config alfworld_taspo_cpu`` trains one step from a directory
outside the checkout. torch, TRL and the other dependencies come from the system's site-packages, as after a
``pip install taspo-trl``; ``taspo_trl`` itself must come from the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Build outputs and local state a user's sdist would not hold; the copy keeps the wheel free of stale files.
NOT_SOURCE = (".git", "outputs", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".whl",
              ".gpu_assets", ".venv")


def _run(command: list[str], cwd: Path) -> str:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PIP_NO_INDEX": "1"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source)], work)
    [built] = (work / "dist").glob("taspo_trl-*.whl")
    return built


def test_the_wheel_carries_every_recipe_and_declares_trl_s_extras(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    shipped = {n.removeprefix("taspo_trl/recipes/") for n in names if n.startswith("taspo_trl/recipes/") and n.endswith(".yaml")}
    in_checkout = {p.relative_to(ROOT / "recipes").as_posix() for p in (ROOT / "recipes").rglob("*.yaml")}
    assert shipped == in_checkout
    assert {"accelerate/zero3.yaml", "quickstart/alfworld_taspo_cpu.yaml", "paper/search/taspo_lora.yaml"} <= shipped
    requires = {line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist: ")}
    assert {'openai>=1.0; extra == "openai"', 'trl[vllm]; extra == "vllm"', 'trl[deepspeed]; extra == "deepspeed"'} <= requires
    assert "trl<1.17,>=1.16.0" in requires
    assert "taspo-recipes = taspo_trl.recipes:main" in entry_points
    # The shipped warm start, so that its first use installs in seconds instead of training.
    warm_start = "taspo_trl/data/warm_starts/smollm2-135m-alfworld/"
    assert {warm_start + f for f in ("adapter_model.safetensors", "adapter_config.json", "warm_start.json")} <= set(names)


@pytest.mark.slow  # about 30 s of training from the installed wheel; the tests above check what it installs
def test_an_installed_wheel_trains_a_recipe_by_name(wheel, tmp_path, tiny_model_dir):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)], tmp_path)
    run_dir = tmp_path / "elsewhere"  # no checkout here: nothing can be found by a relative path
    run_dir.mkdir()

    imported = _run([str(python), "-c", "import taspo_trl; print(taspo_trl.__file__)"], run_dir).strip()
    assert Path(imported).is_relative_to(venv), imported
    recipe = Path(_run([str(bin_dir / "taspo-recipes"), "path", "alfworld_taspo_cpu"], run_dir).strip())
    assert recipe.is_relative_to(venv) and recipe.read_text() == (ROOT / "recipes" / "quickstart" / "alfworld_taspo_cpu.yaml").read_text()

    out = run_dir / "run"
    log = _run(
        [
            str(bin_dir / "taspo-train"), "--config", "alfworld_taspo_cpu", "--model_name_or_path", tiny_model_dir,
            "--max_tasks", "1", "--max_steps", "1", "--max_turns", "2", "--max_completion_length", "8",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
            "--output_dir", str(out),
        ],
        run_dir,
    )
    assert "method=taspo env=alfworld" in log  # the recipe's method, not taspo-train's default (grpo)
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 1
    assert "pi/coverage" in state["log_history"][0]  # logged by the TASPO trainer only
    assert (out / "model.safetensors").is_file()
    assert (run_dir / "outputs" / "alfworld_games" / "quickstart").is_dir()  # the recipe's games_dir, relative to the run
