"""Recipes by name: ``taspo-train --config NAME`` and ``taspo-recipes list|show|copy|path`` find the recipes that
ship inside the package, and the checkout paths (``recipes/...``) still name the same files."""

from __future__ import annotations

from pathlib import Path

import pytest

from taspo_trl.recipes import copy_recipe, find_recipe, main, recipe_files
from taspo_trl.script_args import resolve_config_argv

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = ROOT / "recipes"  # the checkout's paths, as the README and older commands use them
TASPO_QUICKSTART = CHECKOUT / "quickstart" / "alfworld_taspo_cpu.yaml"


def test_the_checkout_paths_are_the_package_files():
    assert TASPO_QUICKSTART.is_file()
    assert TASPO_QUICKSTART.resolve() == (ROOT / "taspo_trl" / "recipes" / "quickstart" / "alfworld_taspo_cpu.yaml")


@pytest.mark.parametrize(
    "name",
    ["alfworld_taspo_cpu", "alfworld_taspo_cpu.yaml", "quickstart/alfworld_taspo_cpu",
     "recipes/quickstart/alfworld_taspo_cpu.yaml"],
)
def test_every_spelling_of_a_name_finds_the_same_file(name):
    assert find_recipe(name).resolve() == TASPO_QUICKSTART.resolve()


def test_a_file_name_that_several_benchmarks_share_needs_the_full_name():
    with pytest.raises(ValueError) as error:
        find_recipe("taspo_lora")
    for env in ("alfworld", "search", "webshop"):
        assert f"paper/{env}/taspo_lora" in str(error.value)
    assert find_recipe("paper/search/taspo_lora").resolve() == (CHECKOUT / "paper" / "search" / "taspo_lora.yaml").resolve()


def test_an_unknown_name_lists_close_names():
    with pytest.raises(ValueError, match="close names: alfworld_taspo_cpu") as error:
        find_recipe("alfworld_tapso_cpu")
    assert "taspo-recipes list" in str(error.value)


def test_listing_covers_every_shipped_yaml_once_and_each_listed_name_finds_its_file(capsys):
    assert main(["list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    shipped = sorted(p.resolve() for p in CHECKOUT.rglob("*.yaml"))
    assert len(names) == len(set(names)) == len(shipped) == len(recipe_files())
    assert sorted(find_recipe(name).resolve() for name in names) == shipped
    assert {"alfworld_taspo_cpu", "zero3", "paper/webshop/alignopsd_lora"} <= set(names)


def test_show_prints_the_recipe_and_path_prints_its_file(capsys):
    assert main(["show", "zero3"]) == 0
    assert capsys.readouterr().out == (CHECKOUT / "accelerate" / "zero3.yaml").read_text()
    assert main(["path", "search_taspo_cpu"]) == 0
    assert Path(capsys.readouterr().out.strip()).resolve() == (CHECKOUT / "quickstart" / "search_taspo_cpu.yaml").resolve()


def test_copy_writes_the_recipe_and_never_overwrites(tmp_path, capsys):
    target = copy_recipe("alfworld_grpo_cpu", tmp_path / "mine")
    assert target == tmp_path / "mine" / "alfworld_grpo_cpu.yaml"
    assert target.read_text() == (CHECKOUT / "quickstart" / "alfworld_grpo_cpu.yaml").read_text()
    target.write_text("method: taspo\n")
    assert main(["copy", "alfworld_grpo_cpu", str(tmp_path / "mine")]) == 2
    assert "exists" in capsys.readouterr().err
    assert target.read_text() == "method: taspo\n"
    assert main(["copy", "cpu_2proc", str(tmp_path)]) == 0
    assert "accelerate launch --config_file" in capsys.readouterr().out


def test_config_argument_resolves_names_and_keeps_files(tmp_path):
    own = tmp_path / "alfworld_taspo_cpu"  # a local file wins over the shipped recipe of the same name
    own.write_text("method: grpo\n")
    argv = ["--config", str(own), "--max_steps", "1"]
    assert resolve_config_argv(argv, "taspo-train") == argv
    resolved = resolve_config_argv(["--max_steps", "1", "--config", "alfworld_taspo_cpu"], "taspo-train")
    assert resolved[:3] == ["--max_steps", "1", "--config"]
    assert Path(resolved[3]).resolve() == TASPO_QUICKSTART.resolve()
    assert resolve_config_argv(["--max_steps", "1"], "taspo-train") == ["--max_steps", "1"]


def test_an_unknown_config_stops_before_any_work_with_the_fix():
    with pytest.raises(SystemExit) as stop:
        resolve_config_argv(["--config", "serch_taspo_cpu"], "taspo-eval")
    message = str(stop.value)
    assert message.startswith("taspo-eval: --config serch_taspo_cpu: no such file")
    assert "search_taspo_cpu" in message
