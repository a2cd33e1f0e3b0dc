"""Build-time pieces of the documentation site (mkdocs `hooks:`): the recipe table is generated from the shipped
recipe files, the benchmark figures under benchmarks/results/ are published next to the results page, and the API
reference renders the docstrings' TRL-style markup (`str` types and HF `[ClassName]` references)."""

from __future__ import annotations

import re
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


def _docstring_markup(html: str) -> str:
    """Outside code blocks: backticked words that mkdocstrings left as text (the parameter types of TRL-style
    docstrings) become code, and an HF-style reference `[`Name`]` becomes a link to that object's entry on the
    page (its id is the dotted path ending in Name), or plain code where the page has none."""
    anchors = {anchor.rsplit(".", 1)[-1]: anchor for anchor in re.findall(r'id="(taspo_trl\.[\w.]+)"', html)}

    def reference(match: re.Match) -> str:
        name = match.group(1)
        short = name.rsplit(".", 1)[-1]
        return f'<a href="#{anchors[short]}"><code>{short}</code></a>' if short in anchors else f"<code>{short}</code>"

    parts = re.split(r"(<pre.*?</pre>)", html, flags=re.S)
    for i, part in enumerate(parts):
        if not part.startswith("<pre"):
            part = re.sub(r"`([^`<>\n]{1,80})`", r"<code>\1</code>", part)
            parts[i] = re.sub(r"\[<code>~?([A-Za-z_][\w.]*)</code>\]", reference, part)
    return "".join(parts)


def on_page_content(html: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook signature
    return _docstring_markup(html) if page.file.src_uri == "api.md" else html

