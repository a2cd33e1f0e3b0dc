"""docs/results.md is generated from benchmarks/results/*.json and can't go stale: the committed page equals what
the JSON renders, a changed JSON value changes the page (so the check fails), and every section names its
provenance."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from taspo_trl.provenance import provenance, source_commit

# A credit-quality result of an earlier warm start, no longer on the page: the rendering tests' fixed input.
EARLIER_RUN = Path(__file__).parent / "fixtures" / "credit_quality_sampled_bf16.json"


@pytest.fixture(scope="module")
def page(load_benchmark):
    return load_benchmark("results_page")


def test_committed_results_page_matches_the_json(page):
    assert page.PAGE.read_text(encoding="utf-8") == page.render(), "run python benchmarks/results_page.py"


def test_readme_results_table_matches_the_json(page):
    readme = page.README.read_text(encoding="utf-8")
    assert page.with_readme_table(readme, page.render_readme_table()) == readme, "run python benchmarks/results_page.py"
    alfworld = next(line for line in readme.splitlines() if line.startswith("| Credit quality on ALFWorld with the"))
    methods = json.loads((page.RESULTS / page.CREDIT_QUALITY_ALFWORLD).read_text())["methods"]
    named = set(re.findall(r"(\w+)(?=[,:] )", alfworld.split(" | ")[1]))
    assert named == set(methods) - {"grpo"}


def test_a_credit_table_row_reads_its_scores_intervals_and_verdicts(page):
    data = json.loads(EARLIER_RUN.read_text())
    assert data["methods"]["taspo"]["scores"]["success"]["auc"] == pytest.approx(0.5750558)
    assert "| taspo | 0.575 [0.484, 0.657] |" in page.credit_quality(data)
    data["methods"]["taspo"]["scores"]["success"]["auc"] = 0.61
    assert "| taspo | 0.610 [0.484, 0.657] | 0.68 | no clear effect | 0.430 [0.354, 0.498] | 0.93 | right way |" in \
        page.credit_quality(data)


def test_a_changed_json_value_changes_the_page(page, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(page.RESULTS, results)
    current = results / page.CREDIT_QUALITY_ALFWORLD  # the README summarises it
    data = json.loads(current.read_text())
    won = data["methods"]["taspo"]["scores"]["success"]["auc"]
    data["methods"]["taspo"]["scores"]["success"]["auc"] = 0.111
    current.write_text(json.dumps(data))
    assert f"| taspo | {won:.3f} [" in page.render() and "| taspo | 0.111 [" in page.render(results)
    data = json.loads(current.read_text())
    intervals = data["methods"]["taspo"]["intervals"]
    intervals["success"]["auc"].update(low=0.2, high=0.3)  # below 0.5 on won trajectories: wrong way
    intervals["failed"]["auc"].update(low=0.7, high=0.8)  # above 0.5 on failed ones: wrong way
    current.write_text(json.dumps(data))
    assert re.search(r"\| Credit quality on ALFWorld [^|]*\| ([^|]*; )?taspo(, \w+)*: wrong way / wrong way",
                     page.render_readme_table(results))


def test_check_mode_fails_on_a_stale_page_or_readme(page, tmp_path, monkeypatch, capsys):
    stale, readme = tmp_path / "results.md", tmp_path / "README.md"
    stale.write_text(re.sub(r"\d\.\d{3}", "9.999", page.render(), count=1), encoding="utf-8")
    readme.write_text(page.README.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(page, "PAGE", stale)
    monkeypatch.setattr(page, "README", readme)
    assert page.main(["--check"]) == 1
    assert "results.md do not match benchmarks/results/" in capsys.readouterr().err
    stale.write_text(page.render(), encoding="utf-8")
    assert page.main(["--check"]) == 0
    text = readme.read_text(encoding="utf-8")
    figure = re.search(r"\d\.\d{2} under its own guidance", text).group(0)  # a figure of the generated table
    readme.write_text(text.replace(figure, "0.99 under its own guidance"), encoding="utf-8")
    assert page.main(["--check"]) == 1
    assert "README.md do not match" in capsys.readouterr().err


def test_a_readme_without_the_markers_is_refused(page):
    with pytest.raises(ValueError, match="lacks the markers"):
        page.with_readme_table("# no table here\n", "| a |")


def test_every_section_states_date_commit_cpu_and_command(page):
    text = page.render()
    for _title, file_names, _section in page.SECTIONS:
        for file_name in file_names:
            block = text.split(f"- Data: `benchmarks/results/{file_name}`", 1)[1].split("\n## ", 1)[0]
            for field in ("- Measured: 20", "commit `", "- CPU: ", "(flags: ", "- Command: `python benchmarks/"):
                assert field in block, (file_name, field)


def test_a_result_without_provenance_is_refused(page, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(page.RESULTS, results)
    path = results / "pi_specificity.json"
    data = json.loads(path.read_text())
    del data["provenance"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="pi_specificity.json has no 'provenance' block: rerun its benchmark"):
        page.render(results)


def test_provenance_reads_the_cpu_and_the_command(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse2 avx2 fma\n\n"
                       "processor\t: 1\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse2 avx2 fma\n")
    record = provenance(["--batches", "2"], "/somewhere/benchmarks/credit_quality.py", str(cpuinfo))
    assert record["cpu_model"] == "Example CPU 9000"
    assert record["cpu_flags"] == ["avx2"]
    assert record["command"] == "python benchmarks/credit_quality.py --batches 2"
    assert record["date"].endswith(" UTC")


def test_a_run_records_the_commit_it_started_from_when_head_moves_before_it_ends(tmp_path):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    script = tmp_path / "benchmarks" / "bench.py"
    script.parent.mkdir()
    script.write_text("print(1)\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    first = git("rev-parse", "HEAD")
    started_at = source_commit(str(script))
    script.write_text("print(2)\n")  # a later commit lands while the run plays its batches
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second")
    assert started_at == first != git("rev-parse", "HEAD")
    assert provenance([], str(script), commit=started_at)["commit"] == first
    assert provenance([], str(script))["commit"] == git("rev-parse", "HEAD")
    script.write_text("print(3)\n")
    assert source_commit(str(script)) == git("rev-parse", "HEAD") + "-dirty"


def test_replication_says_whether_each_verdict_holds(page):
    earlier = json.loads(EARLIER_RUN.read_text())
    current = json.loads(json.dumps(earlier))
    del current["superseded"]
    current["methods"]["taspo"]["intervals"]["failed"]["auc"].update(low=0.45, high=0.55)  # now holds 0.5
    text = page.credit_replication(current, earlier)
    # TASPO failed: [0.354, 0.498] lies below 0.5 (right way); [0.45, 0.55] holds it.
    assert "| taspo | failed | no clear effect (0.430) | right way (0.430) | no |" in text
    assert "| taspo | won | no clear effect (0.575) | no clear effect (0.575) | yes |" in text
    assert "| gigpo | failed | wrong way (0.573) | wrong way (0.573) | n/a: the method changed |" in text
    assert "| grpo | won | no credit moved (0.500) | no credit moved (0.500) | yes |" in text


def _replication_run(precision, cpu_flags, fingerprint, taspo_failed_interval):
    """A two-method run whose GRPO verdicts are 'no credit moved' and whose TASPO verdicts follow the intervals;
    ``precision`` is (the precision, why it was chosen)."""
    def entry(moved, won, failed):
        return {"moved": {"success": moved, "failed": moved},
                "intervals": {"success": {"auc": dict(zip(("low", "high"), won))},
                              "failed": {"auc": dict(zip(("low", "high"), failed))}},
                "scores": {"success": {"auc": sum(won) / 2}, "failed": {"auc": sum(failed) / 2}}}
    mode, reason = precision
    return {"settings": {"batches": 3}, "precision": mode,
            "precision_reasons": [{"reason": reason, "seeds": [0, 1, 2], "methods": ["taspo"]}],
            "warm_start_fingerprint": fingerprint,
            "provenance": {"date": "2026-12-04 18:00 UTC", "cpu_model": "AMD EPYC", "cpu_flags": cpu_flags},
            "methods": {"grpo": entry(0.0, (0.5, 0.5), (0.5, 0.5)),
                        "taspo": entry(0.9, (0.55, 0.75), taspo_failed_interval)}}


def test_replication_names_what_differs_and_counts_the_verdicts_that_hold(page):
    float32 = _replication_run(("float32", "auto: no bf16"), ["avx2"], "abc", (0.30, 0.45))
    bf16 = _replication_run(("bf16 autocast", "set by bf16: true"), ["avx2", "avx512_bf16"], "abc", (0.40, 0.60))
    assert "played again on another CPU and in another precision." in page.credit_replication(float32, bf16)
    same_cpu = _replication_run(("bf16 autocast", "auto"), ["avx2"], "xyz", (0.30, 0.45))
    assert "played again with another build of the warm start and in another precision." in page.credit_replication(
        float32, same_cpu)
    assert "with the same CPU, warm start and precision" in page.credit_replication(float32, float32)
    # TASPO won: [0.55, 0.75] right way in both; failed: [0.30, 0.45] right way, [0.40, 0.60] no clear effect.
    # GRPO is left out of the count: 1 of TASPO's 2 verdicts holds.
    assert page._summary_replication(float32, bf16) == (
        "1 of 2 hold (3 batches float32 vs 3 batches bf16 autocast); changed: taspo failed (right way / no clear effect)")
    assert page._summary_replication(float32, same_cpu) == "2 of 2 hold (3 batches float32 vs 3 batches bf16 autocast)"


def test_a_merge_is_placed_on_the_cpus_that_played_its_parts_not_the_one_that_merged_them(page):
    avx2 = {"cpu_model": "AMD EPYC", "cpu_flags": ["avx2"]}
    bf16_cpu = {"cpu_model": "AMD EPYC", "cpu_flags": ["avx2", "avx512_bf16"]}
    float32 = _replication_run(("float32", "auto: no bf16"), ["avx2"], "abc", (0.30, 0.45))
    bf16 = _replication_run(("bf16 autocast", "auto"), ["avx2", "avx512_bf16"], "abc", (0.30, 0.45))
    # seeds 0-4 played on the AVX2 box and merged there, seeds 5-6 played and merged on the bf16 box
    float32["provenance"] = {**bf16_cpu, "date": "2026-12-05 10:00 UTC", "commit": "f00", "command": "merge all",
                             "merged_from": [
                                 {**avx2, "date": "d0", "commit": "a", "command": "merge 0-4", "merged_from": [
                                     {**avx2, "date": "d1", "commit": "b", "command": "play 0-4"}]},
                                 {**bf16_cpu, "date": "d2", "commit": "c", "command": "play 5-6"}]}
    assert page._played_on(float32["provenance"]) == ["AMD EPYC (flags: avx2)", "AMD EPYC (flags: avx2, avx512_bf16)"]
    assert "played again partly on another CPU and in another precision." in page.credit_replication(float32, bf16)
    assert "played again partly on another CPU and in another precision." in page.credit_replication(bf16, float32)
    float32["provenance"]["merged_from"].pop()  # now only the AVX2 box played it
    assert "played again on another CPU and in another precision." in page.credit_replication(float32, bf16)
    float32["settings"] = {"env": "alfworld"}
    lines = page._provenance(float32, "x.json").splitlines()
    assert "- CPU: AMD EPYC (flags: avx2)" in lines  # not the merging box
    assert lines[-2:] == ["  - pooling the batches of `merge 0-4`, d0, commit `a`",
                          "    - pooling the batches of `play 0-4`, d1, commit `b`, on AMD EPYC (flags: avx2)"]


def test_an_interval_end_next_to_the_boundary_is_not_printed_as_the_boundary(page):
    # 0.4999571 excludes 0.5 (a "right way" verdict on failed trajectories): three decimals would print 0.500.
    assert page._with_interval(0.4363, {"low": 0.3710, "high": 0.4999571}) == "0.436 [0.371, 0.49996]"
    assert page._with_interval(0.5, {"low": 0.5, "high": 0.5}) == "0.500 [0.500, 0.500]"
    assert page._with_interval(-0.0637, {"low": -0.129, "high": -0.0000429}, signed=True) == "-0.064 [-0.129, -0.00004]"
    assert page._with_interval(0.6, {"low": None, "high": None}) == "0.600"


def test_a_merged_result_names_every_run_it_pools_and_its_notes(page):
    result = json.loads((page.RESULTS / "credit_quality_search_float32.json").read_text())
    result["provenance"]["merged_from"] = [
        {"command": "python benchmarks/credit_quality.py --seed 0 --batches 2", "date": "2026-12-04 11:08 UTC", "commit": "0ff7627abcdef0123"},
        {"command": "python benchmarks/credit_quality.py --seed 2 --batches 5", "date": "2026-12-04 13:00 UTC", "commit": None},
    ]
    text = page._provenance(result, "x.json")
    assert "  - pooling the batches of `python benchmarks/credit_quality.py --seed 0 --batches 2`, 2026-12-04 11:08 UTC, commit `0ff7627abcde`, on a CPU not recorded" in text
    assert "`python benchmarks/credit_quality.py --seed 2 --batches 5`, 2026-12-04 13:00 UTC, commit `unknown`, on a CPU not recorded" in text
    result["provenance"]["merged_from"][0]["merged_from"] = [  # a merge pooled in a later merge
        {"command": "python benchmarks/credit_quality.py --seed 0 --batches 1", "date": "2026-12-04 10:00 UTC", "commit": "abc"}]
    nested = page._provenance(result, "x.json").splitlines()
    assert nested[-3:] == [
        "  - pooling the batches of `python benchmarks/credit_quality.py --seed 0 --batches 2`, 2026-12-04 11:08 UTC, commit `0ff7627abcde`",
        "    - pooling the batches of `python benchmarks/credit_quality.py --seed 0 --batches 1`, 2026-12-04 10:00 UTC, commit `abc`, on a CPU not recorded",
        "  - pooling the batches of `python benchmarks/credit_quality.py --seed 2 --batches 5`, 2026-12-04 13:00 UTC, commit `unknown`, on a CPU not recorded",
    ]
    result["notes"] = {"gigpo": "a note."}
    assert "\n\nNote on gigpo: a note.\n\nPer batch" in page.credit_quality(result)


def test_the_readme_groups_methods_by_their_verdicts(page):
    def entry(won, failed):
        return {"intervals": {"success": {"auc": dict(zip(("low", "high"), won))},
                              "failed": {"auc": dict(zip(("low", "high"), failed))}},
                "moved": {"success": 1.0, "failed": 1.0}}

    result = {"methods": {"grpo": entry((0.5, 0.5), (0.5, 0.5)), "a": entry((0.6, 0.7), (0.2, 0.4)),
                          "b": entry((0.2, 0.4), (0.4, 0.6)), "c": entry((0.55, 0.9), (0.1, 0.3))}}
    # a and c: won interval above 0.5, failed below it; b: won below 0.5, failed holds it.
    assert page._summary_verdicts(result) == "a, c: right way / right way; b: wrong way / no clear effect"


def test_pi_specificity_of_two_policies_names_each_column_and_summary_by_its_label(page):
    one = json.loads((page.RESULTS / "pi_specificity.json").read_text())
    before = {**one, "settings": {**one["settings"], "label": "before"}, "gap_share_own_quoted": 0.18}
    after = {**one, "settings": {**one["settings"], "label": "after"}, "gap_share_own_quoted": 0.75}
    table = page.pi_specificity(before, after)
    assert "| before, `train`, own guidance | before, `train`, foreign | after, `train`, own guidance |" in table
    summary = page._summary_pi(before, after)
    assert summary.startswith("before, `train`: 0.18 under its own guidance") and "after, `train`: 0.75" in summary
    alone = page.pi_specificity(before, before)  # one policy: the columns name only the split
    assert "| `train`, own guidance | `train`, foreign |" in alone and "before," not in alone


def test_a_precision_chosen_for_several_reasons_reads_with_the_seeds_of_each(page):
    def run(*reasons):
        return {"precision": "float32", "precision_reasons": [
            {"reason": reason, "seeds": seeds, "methods": methods} for reason, seeds, methods in reasons]}

    assert page._precision_text(run(("auto: no bf16 here", [0, 1, 2], ["taspo"]))) == "float32 (auto: no bf16 here)"
    assert page._precision_text(run(("auto: no bf16 here", [0, 1, 4], ["taspo"]), ("set by bf16: false", [2], ["taspo"]))) \
        == "float32 (seeds 0-1, 4: auto: no bf16 here; seed 2: set by bf16: false)"
    # two reasons on the same seeds: each names the methods it scored
    assert page._precision_text(run(("auto", [0, 1], ["taspo", "gigpo"]), ("set by bf16: false", [0, 1], ["rlsd"]))) \
        == "float32 (seeds 0-1 for taspo, gigpo: auto; seeds 0-1 for rlsd: set by bf16: false)"
    assert page._precision_text({"precision": "bf16 autocast"}) == "bf16 autocast"  # a file without reasons


def test_a_section_anchor_is_the_same_on_the_docs_site_and_on_github(page):
    assert page.anchor("The warm start's build") == "the-warm-starts-build"
    assert page.anchor("Learning-curve pilot: GRPO at five times the learning rate") == \
        "learning-curve-pilot-grpo-at-five-times-the-learning-rate"
    # the docs site makes "240-games-corrections" of this, GitHub "240-games--corrections"
    with pytest.raises(ValueError, match="reword it"):
        page.anchor("Warm start (240 games + corrections)")
    assert [page.anchor(title) for title, _, _ in page.SECTIONS]  # every section's title has one


def test_the_warm_start_build_reads_its_rebuild_check(page):
    build = json.loads((page.RESULTS / "warm_start_build.json").read_text())
    build.pop("check", None)
    assert "--check" not in page.warm_start_build(build)
    build["check"] = {"rebuild_seconds": 5940.0, "same_data": True, "largest_relative_difference": 0.0,
                      "tolerance": 0.0, "built_with": {"bf16": True},
                      "provenance": {"date": "2026-12-07 07:50 UTC", "cpu_model": "AMD EPYC"}}
    text = page.warm_start_build(build)
    assert "(2026-12-07 07:50 UTC, AMD EPYC, bf16 autocast) in 1 h 39 min 00 s:" in text
    assert "training data the same, adapter bit for bit against the shipped one" in text
    build["check"].update(same_data=False, largest_relative_difference=0.0042)
    assert "training data different, adapter largest relative difference 0.0042 against" in page.warm_start_build(build)


def test_pi_specificity_correlation_reads_with_its_interval_and_within_outcome_figures(page):
    bare = {"correlation": 0.5795}
    assert page._correlation(bare) == "0.58"  # a result written before the interval existed
    full = {**bare, "correlation_interval_95": [0.4256, 0.7128], "correlation_by_outcome": {"won": 0.1, "failed": None}}
    assert page._correlation(full) == "0.58 [0.43, 0.71] (within won trajectories 0.10, within failed undefined)"


def test_a_learning_curve_says_whether_it_started_from_the_shipped_warm_start(page):
    name = "embedded:smollm2-135m-alfworld"
    shipped = json.loads((page.shipped_warm_start_dir(name) / "warm_start.json").read_text())["data_sha256"]
    assert page._which_warm_start({"name": name, "data_sha256": shipped}) == (
        f"the shipped warm start, training rows {shipped[:12]}")
    other = "0" * 64
    assert page._which_warm_start({"name": name, "data_sha256": other}) == (
        "an earlier warm start, not the one shipped now, training rows 000000000000")
    assert page._which_warm_start({"name": name}) == "a warm start built on first use"


def test_a_curve_with_only_unfinished_runs_states_where_they_stand(page):
    run = {"method": "grpo", "seed": 0, "done": False,
           "points": [{"step": 0, "success": 0.25}, {"step": 10, "success": 0.2}, {"step": 20, "success": 0.1}]}
    started = {"method": "grpo", "seed": 1, "done": False, "points": [{"step": 0, "success": 0.25}]}
    result = {"planned": {"methods": ["grpo", "taspo"], "seeds": [0, 1]}, "runs": [run, started], "methods": {}}
    assert page.curve_statement(result) == (
        "A pilot, not the full run: 0 of 4 runs finished. Unfinished, grpo seed 0: success 0.250 at step 0, 0.100 at "
        "step 20. No method can be compared with GRPO yet.")
