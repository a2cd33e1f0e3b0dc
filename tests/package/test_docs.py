"""The documentation ships with the repo: the site under docs/ builds in strict mode (no broken link, missing page
or docstring reference to a moved name), docs/methods.md is linked from the README and cites code that exists,
and nothing a user installs or reads points to a document outside the repo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
METHODS = ROOT / "docs" / "methods.md"

# Documents that lived outside this repository during development, and tracker numbers: a user has neither.
OUTSIDE_REFERENCE = re.compile(
    r"DESIGN\.md|BASELINES\.md|\.\./BASELINES|/work/shared|\.\./shared|design notes|\bissue\s*#?\d+", re.IGNORECASE
)


def _user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder, suffixes in (("taspo_trl", {".py", ".md"}), ("recipes", {".py", ".yaml"}), ("envs", {".py", ".md", ".sh"})):
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in suffixes]
    return files


def test_no_reference_to_documents_outside_the_repo():
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _user_facing_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE_REFERENCE.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_site_builds_offline_in_strict_mode(tmp_path):
    """`mkdocs build --strict` turns every warning into a failure: a link to a page or heading that does not exist,
    an API entry naming a moved object, a malformed docstring section."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    built = {path.relative_to(tmp_path / "site").as_posix() for path in (tmp_path / "site").rglob("index.html")}
    for page in ("getting-started", "methods", "recipes", "results", "api", "troubleshooting"):
        assert f"{page}/index.html" in built, page
    recipes = (tmp_path / "site" / "recipes" / "index.html").read_text(encoding="utf-8")
    assert "recipes/quickstart/alfworld_taspo_cpu.yaml" in recipes  # the table generated from the recipe files
    assert (tmp_path / "site" / "results" / "learning_curve_cpu.png").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="taspo_trl.privileged.context.PrivilegedContextConfig"' in api  # TASPO's analyzer_*/pi_* fields
    text = "".join(part for part in re.split(r"<pre.*?</pre>", api, flags=re.S))
    assert re.findall(r"`[^`<>\n]{1,60}`", text) == []  # no literal backticks left from the docstrings
    assert re.findall(r"\[<code>\w+</code>\]", text) == []  # HF-style references rendered
    assert '<a href="#taspo_trl.trainers.grpo.AgentGRPOTrainer"><code>AgentGRPOTrainer</code></a>' in api


def _nav_pages(nav: list) -> set[str]:
    pages: set[str] = set()
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_page_is_in_the_navigation():
    """The site is the guides, the reference and the generated results page: no page sits outside the navigation
    (a lab notebook or a superseded page; history is in git)."""
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    assert {p.name for p in (ROOT / "docs").glob("*.md")} == nav


def _anchors(page: Path) -> set[str]:
    """The heading ids of a Markdown page, as GitHub and the docs site make them (``benchmarks/results_page.py``'s
    section titles are checked to get the same on both)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    titles = re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)
    return {re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title).strip().lower()) for title in titles}


def test_every_relative_link_of_the_readme_and_the_guides_reaches_its_page_and_heading():
    """mkdocs checks the links between the site's pages; this checks the README's too (GitHub shows it, the site
    does not build it), and the guides' links to files of the repository."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if page.parent.name == "docs" and path.startswith("results/"):  # the figures mkdocs_hooks.py publishes
                linked = ROOT / "benchmarks" / path
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_every_docs_section_a_docstring_names_exists():
    """A docstring that sends the reader to a section, ``docs/<page>.md ("<Heading>")``, names a heading of that
    page."""
    cited = [(path, page, heading) for path in sorted((ROOT / "taspo_trl").rglob("*.py"))
             for page, heading in re.findall(r"docs/([\w-]+\.md) \(\"([^\"]+)\"\)", path.read_text(encoding="utf-8"))]
    assert cited  # credit/registry.py cites two sections of docs/credit-methods.md
    missing = [f"{path.relative_to(ROOT)}: docs/{page} has no heading {heading!r}" for path, page, heading in cited
               if not re.search(rf"^#+ {re.escape(heading)}\s*$", (ROOT / "docs" / page).read_text(encoding="utf-8"), re.M)]
    assert not missing, missing


def test_the_training_step_page_numbers_the_parts_as_the_code_does():
    """docs/training-step.md walks through ``_generate_and_score_completions`` in the parts its numbered comments
    mark, with the same numbers and names."""
    from taspo_trl.trainers import grpo

    source = Path(grpo.__file__).read_text(encoding="utf-8")
    step = source[source.index("def _generate_and_score_completions"):]
    step = step[:step.index("\n    def ", 1)]
    in_code = dict(re.findall(r"^ +# (\d+)\. (.+)$", step, flags=re.M))
    page = (ROOT / "docs" / "training-step.md").read_text(encoding="utf-8")
    on_page = dict(re.findall(r"^(\d+)\. \*\*([^*]+?)\.?\*\*", page, flags=re.M))
    assert list(on_page) == list(in_code) == [str(n) for n in range(1, len(in_code) + 1)], (on_page, in_code)
    for number, name in on_page.items():
        assert name.lower() in in_code[number].lower(), (number, name, in_code[number])
    docstring_parts = re.findall(r"^(\d+)\. ", grpo.__doc__, flags=re.M)
    assert docstring_parts == list(in_code), "trainers/grpo.py's docstring numbers the step's parts otherwise"


def test_readme_is_short_and_points_to_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 210
    for page in ("docs/getting-started.md", "docs/results.md", "docs/methods.md"):
        assert f"]({page})" in readme, page


def test_methods_page_is_linked_from_the_readme():
    assert "](docs/methods.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_methods_table_covers_the_required_choices():
    text = METHODS.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| topic")]
    topics = " ".join(row.split("|")[1] for row in rows)
    for required in ("κ", "Token-level", "AlignOPSD", "StepOPSD", "SDAR's sign"):
        assert required in topics, required
    # Each row answers the four questions: paper, code, why, where.
    assert all(row.count("|") - row.count("\\|") == 6 for row in rows), [r[:60] for r in rows if r.count("|") != 6]


def test_every_code_location_cited_in_the_methods_page_exists():
    text = METHODS.read_text(encoding="utf-8")
    cited = set(re.findall(r"`((?:credit|privileged|trainers|rollout)/\w+\.py|evaluation\.py)`", text))
    assert len(cited) >= 8
    missing = [path for path in cited if not (ROOT / "taspo_trl" / path).is_file()]
    assert not missing, missing


def test_methods_page_marks_no_baseline_part_as_missing():
    """OPID's step skills, Skill-SD's summarised skills and periodic teacher, and the analyzer's reasoning-off
    setting are built: no row says otherwise, and their rows name the settings that run them."""
    text = METHODS.read_text(encoding="utf-8")
    assert "not built yet" not in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "opid_max_step_skills" in rows["OPID"] and "Δ_step" in rows["OPID"]
    assert "teacher_sync_steps" in rows["Skill-SD"] and "success_skills" in rows["Skill-SD"]
    assert "analyzer_reasoning" in rows["Analyzer reasoning mode"]


def test_config_fields_cited_in_the_methods_page_exist():
    from taspo_trl.evaluation import EvalArguments
    from taspo_trl.trainers import AlignOPSDConfig, BaselineConfig, TASPOConfig

    classes = {c.__name__: c for c in (TASPOConfig, AlignOPSDConfig, BaselineConfig, EvalArguments)}
    cited = re.findall(r"`(\w+Config|EvalArguments)\.(\w+)`", METHODS.read_text(encoding="utf-8"))
    assert len(cited) >= 5
    missing = [f"{cls}.{name}" for cls, name in cited if name not in {f.name for f in fields(classes[cls])}]
    assert not missing, missing


def test_every_trainer_and_config_the_readme_names_imports_from_the_package():
    """The README's `XTrainer` / `XConfig` names are the package's public API: `from taspo_trl import X` works."""
    import taspo_trl

    named = set(re.findall(r"`(\w+(?:Trainer|Config))\b", (ROOT / "README.md").read_text(encoding="utf-8")))
    ours = {name for name in named if not name.startswith(("GRPO", "SFT")) or name in taspo_trl.__all__}
    assert {"TASPOTrainer", "AlignOPSDTrainer", "BaselineTrainer", "BaselineConfig"} <= ours
    missing = sorted(name for name in ours if not hasattr(taspo_trl, name))
    assert not missing, f"named in the README but not exported from taspo_trl: {missing}"
