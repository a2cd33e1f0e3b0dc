"""The documentation ships with the repo: the site under docs/ builds in strict mode (no broken link, missing page
or docstring reference to a moved name), docs/methods.md is linked from the README and cites code that exists,
and nothing a user installs or reads points to a document outside the repo."""

from __future__ import annotations

import json
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
    an API entry naming a moved object, a malformed docstring section. The experiment log is built (the generated
    results page links to it) but is history, not part of the site's navigation."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    built = {path.relative_to(tmp_path / "site").as_posix() for path in (tmp_path / "site").rglob("index.html")}
    for page in ("getting-started", "methods", "recipes", "results", "api", "troubleshooting", "experiment-log"):
        assert f"{page}/index.html" in built, page
    assert "experiment-log.md" not in json.dumps(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    recipes = (tmp_path / "site" / "recipes" / "index.html").read_text(encoding="utf-8")
    assert "recipes/quickstart/alfworld_taspo_cpu.yaml" in recipes  # the table generated from the recipe files
    assert (tmp_path / "site" / "results" / "learning_curve_cpu.png").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="taspo_trl.privileged.context.PrivilegedContextConfig"' in api  # TASPO's analyzer_*/pi_* fields
    text = "".join(part for part in re.split(r"<pre.*?</pre>", api, flags=re.S))
    assert re.findall(r"`[^`<>\n]{1,60}`", text) == []  # no literal backticks left from the docstrings
    assert re.findall(r"\[<code>\w+</code>\]", text) == []  # HF-style references rendered
    assert '<a href="#taspo_trl.trainers.grpo.AgentGRPOTrainer"><code>AgentGRPOTrainer</code></a>' in api


def test_no_guide_links_to_the_experiment_log():
    """The README and the guides say what to run and what to expect; the measured figures are on the generated results
    page, and the experiment log (history) is linked from that page only."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    linking = [p.name for p in pages if p.name not in ("results.md", "experiment-log.md")
               and "experiment-log.md" in p.read_text(encoding="utf-8")]
    assert not linking, linking


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
