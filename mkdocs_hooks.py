"""Build-time pieces of the documentation site (mkdocs `hooks:`): the recipe table is generated from the shipped
recipe files, and the benchmark figures under benchmarks/results/ are published next to the results page."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "benchmarks" / "results"
RECIPE_TABLE = "<!-- recipe-table -->"


def recipe_table() -> str:
    """One row per shipped recipe and accelerate config: its name for `--config` and what it runs."""
    from taspo_trl.recipes import describe, recipe_files, short_name

    files = recipe_files()
    rows = ["| `--config` | file | what it runs |", "|---|---|---|"]
    for full_name, path in files.items():
        what = describe(path).replace("|", "\\|") or "an accelerate launch config"
        rows.append(f"| `{short_name(full_name, list(files))}` | `recipes/{full_name}.yaml` | {what} |")
    return "\n".join(rows)


def on_files(files, config):  # noqa: ANN001, ANN201 - mkdocs' hook signature
    for image in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{image.name}", abs_src_path=str(image)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook signature
    if RECIPE_TABLE in markdown:
        markdown = markdown.replace(RECIPE_TABLE, recipe_table())
    return markdown
