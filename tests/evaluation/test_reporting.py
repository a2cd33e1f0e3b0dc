"""taspo_trl.reporting: log loading (HF trainer_state.json, JSONL), curve PNGs, Table 1 / Table 4 rendering, CLI."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from taspo_trl.envs.alfworld.tasks import TASK_TYPES
from taspo_trl.reporting import (
    load_log_history,
    main,
    plot_training_curves,
    render_groups_table,
    render_results_table,
    render_steps_table,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _log_history(success: list[float], kl_scale: float = 0.01) -> list[dict]:
    """Log entries as HF Trainer writes them: one per logging step, then the end-of-training summary."""
    logs = [
        {
            "loss": 0.1 * step,
            "grad_norm": 0.5,
            "learning_rate": 1e-5,
            "success/all": rate,
            "reward": rate,
            "kl": kl_scale * step,
            "taspo/weight_std": 0.05 * step,
            "taspo/weight_mean": 1.0,
            "epoch": step / len(success),
            "step": step,
        }
        for step, rate in enumerate(success, start=1)
    ]
    logs.append({"train_runtime": 12.5, "train_loss": 0.2, "total_flos": 0.0, "epoch": 1.0, "step": len(success)})
    return logs


def _trainer_state(logs: list[dict]) -> dict:
    """The complete trainer_state.json layout of transformers' TrainerState.save_to_json."""
    return {
        "best_global_step": None,
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": 1.0,
        "eval_steps": 500,
        "global_step": logs[-1]["step"],
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": logs,
        "logging_steps": 1,
        "max_steps": logs[-1]["step"],
        "num_input_tokens_seen": 0,
        "num_train_epochs": 1,
        "save_steps": 500,
        "stateful_callbacks": {
            "TrainerControl": {
                "args": {"should_epoch_stop": False, "should_evaluate": False, "should_log": False,
                         "should_save": True, "should_training_stop": True},
                "attributes": {},
            }
        },
        "total_flos": 0.0,
        "train_batch_size": 4,
        "trial_name": None,
        "trial_params": None,
    }


def _write_state(folder: Path, logs: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    path.write_text(json.dumps(_trainer_state(logs), indent=2))
    return path


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# ---------------------------------------------------------------------------------------------------------------
# loading


def test_load_trainer_state_from_dir_file_and_latest_checkpoint(tmp_path):
    logs = _log_history([0.0, 0.25, 0.5])
    state = _write_state(tmp_path / "run", logs)
    assert load_log_history(tmp_path / "run") == logs
    assert load_log_history(state) == logs
    assert load_log_history(str(state)) == logs

    # Without a top-level state the newest checkpoint counts, by step number (10 > 2, not by name).
    _write_state(tmp_path / "ckpt_run" / "checkpoint-2", logs[:2])
    _write_state(tmp_path / "ckpt_run" / "checkpoint-10", logs)
    (tmp_path / "ckpt_run" / "checkpoint-99").mkdir()  # an interrupted save without a state file
    assert load_log_history(tmp_path / "ckpt_run") == logs
    assert load_log_history(tmp_path / "ckpt_run" / "checkpoint-2") == logs[:2]


def test_load_jsonl_and_json_list(tmp_path):
    logs = _log_history([0.0, 1.0])
    jsonl = tmp_path / "logs.jsonl"
    jsonl.write_text("\n".join(json.dumps(entry) for entry in logs[:1]) + "\n\n" + json.dumps(logs[1]) + "\n")
    assert load_log_history(jsonl) == logs[:2]
    listed = tmp_path / "logs.json"
    listed.write_text(json.dumps(logs))
    assert load_log_history(listed) == logs
    only_jsonl = tmp_path / "jsonl_run"
    only_jsonl.mkdir()
    (only_jsonl / "metrics.jsonl").write_text(json.dumps(logs[0]) + "\n")
    assert load_log_history(only_jsonl) == logs[:1]


def test_load_errors_name_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        load_log_history(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="expected a trainer_state.json"):
        load_log_history(tmp_path / "empty")
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_log_history(bad_line)
    not_dicts = tmp_path / "numbers.jsonl"
    not_dicts.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"numbers.jsonl:1: expected a JSON object"):
        load_log_history(not_dicts)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="'log_history' list"):
        load_log_history(config)


# ---------------------------------------------------------------------------------------------------------------
# curves


def test_curves_png_has_one_panel_per_logged_metric(tmp_path):
    runs = {"GRPO": _log_history([0.0, 0.25, 0.25, 0.5]), "TASPO": _log_history([0.0, 0.5, 0.75, 1.0], 0.02)}
    out = tmp_path / "figs" / "curves.png"
    plotted = plot_training_curves(runs, out, metrics=("success/all", "kl", "not/logged", "taspo/weight_std"))
    assert plotted == ["success/all", "kl", "taspo/weight_std"]
    assert _png_size(out) == (3 * 400, 300)  # 3 panels in one row of 4 x 3 inch panels at 100 dpi

    # Defaults, smoothing and a 2-column layout: the 4 default metrics these logs hold fill a 2 x 2 grid.
    out2 = tmp_path / "smoothed.png"
    plotted = plot_training_curves(runs, out2, smoothing=0.6, columns=2, dpi=50)
    assert plotted == ["success/all", "reward", "kl", "taspo/weight_std"]
    assert _png_size(out2) == (2 * 200, 2 * 150)


def test_curves_from_paths_and_partial_runs(tmp_path):
    _write_state(tmp_path / "grpo", _log_history([0.0, 0.5]))
    alignopsd = [{"success/all": 0.5, "alignopsd/alpha_mean": 0.3, "step": 1}]
    (tmp_path / "alignopsd.jsonl").write_text(json.dumps(alignopsd[0]) + "\n")
    out = tmp_path / "curves.png"
    plotted = plot_training_curves([tmp_path / "grpo", tmp_path / "alignopsd.jsonl"], out,
                                   metrics=("success/all", "alignopsd/alpha_mean"))
    assert plotted == ["success/all", "alignopsd/alpha_mean"]  # a metric one run lacks is drawn for the other
    assert _png_size(out) == (800, 300)
    # One path on its own is one run; epochs as x axis.
    assert plot_training_curves(str(tmp_path / "grpo"), out, metrics=("kl",), x_key="epoch") == ["kl"]
    assert _png_size(out) == (400, 300)


def test_curves_errors(tmp_path, monkeypatch):
    runs = {"run": _log_history([0.0, 1.0])}
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
        with pytest.raises(ImportError, match=r"taspo-trl\[report\]"):
            plot_training_curves(runs, tmp_path / "x.png")
    with pytest.raises(ValueError, match="none of the metrics"):
        plot_training_curves(runs, tmp_path / "x.png", metrics=("alignopsd/alpha_mean",))
    with pytest.raises(ValueError, match="smoothing"):
        plot_training_curves(runs, tmp_path / "x.png", smoothing=1.0)
    with pytest.raises(ValueError, match="no runs"):
        plot_training_curves({}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------------------------------------------
# tables


def _alfworld(method: str, split: str, wins: list[int], n: list[int], steps: list[float | None]) -> dict:
    groups = {
        family: {"n": k, "success": w / k, "score": w / k, "mean_steps_success": s}
        for family, w, k, s in zip(TASK_TYPES, wins, n, steps)
    }
    total_steps = [s * w for s, w in zip(steps, wins) if s is not None]
    return {
        "env": "alfworld",
        "model": "smollm2-135m",
        "method": method,
        "split": split,
        "num_tasks": sum(n),
        "seed": 0,
        "groups": groups,
        "overall": {
            "n": sum(n),
            "success": sum(wins) / sum(n),
            "score": sum(wins) / sum(n),
            "mean_steps_success": sum(total_steps) / sum(wins) if sum(wins) else None,
        },
    }


def test_alfworld_table_seen_and_unseen_side_by_side():
    results = [
        # GRPO seen: 3/4, 1/2, 0/3, 2/5, 1/1, 0/1 -> 7/16 = 43.75% overall
        _alfworld("GRPO", "eval_seen", [3, 1, 0, 2, 1, 0], [4, 2, 3, 5, 1, 1], [8, 6, None, 10, 12, None]),
        _alfworld("GRPO", "eval_unseen", [1, 0, 0, 0, 0, 0], [3, 1, 1, 1, 1, 1], [9, None, None, None, None, None]),
        # TASPO seen: 4/4, 2/2, 1/3, 3/5, 1/1, 1/1 -> 12/16 = 75%; no unseen run
        _alfworld("TASPO", "eval_seen", [4, 2, 1, 3, 1, 1], [4, 2, 3, 5, 1, 1], [7, 5, 14, 9, 11, 20]),
    ]
    table = render_results_table(results)
    lines = table.splitlines()
    assert lines[0] == (
        "| Method | Pick (Seen) | Look (Seen) | Clean (Seen) | Heat (Seen) | Cool (Seen) | Pick2 (Seen) | All (Seen) "
        "| Pick (Unseen) | Look (Unseen) | Clean (Unseen) | Heat (Unseen) | Cool (Unseen) | Pick2 (Unseen) "
        "| All (Unseen) |"
    )
    assert lines[1] == "|---|" + "---:|" * 14
    # 3/4 = 75.0, 1/2 = 50.0, 0/3 = 0.0, 2/5 = 40.0, 1/1 = 100.0, 0/1 = 0.0, 7/16 = 43.75 -> 43.8;
    # unseen 1/3 -> 33.3, overall 1/8 = 12.5
    assert lines[2] == (
        "| GRPO | 75.0 | 50.0 | 0.0 | 40.0 | 100.0 | 0.0 | 43.8 | 33.3 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 12.5 |"
    )
    assert lines[3] == "| TASPO | 100.0 | 100.0 | 33.3 | 60.0 | 100.0 | 100.0 | 75.0 |" + " – |" * 7
    assert len(lines) == 4

    bold = render_results_table(results[:1] + results[2:], bold_best=True, digits=2).splitlines()
    assert bold[0] == "| Method | Pick | Look | Clean | Heat | Cool | Pick2 | All |"
    assert bold[2] == "| GRPO | 75.00 | 50.00 | 0.00 | 40.00 | **100.00** | 0.00 | 43.75 |"
    assert bold[3] == (
        "| TASPO | **100.00** | **100.00** | **33.33** | **60.00** | **100.00** | **100.00** | **75.00** |"
    )


def test_alfworld_mean_steps_table():
    grpo = _alfworld("GRPO", "eval_seen", [3, 1, 0, 2, 1, 0], [4, 2, 3, 5, 1, 1], [8, 6, None, 10, 12, None])
    taspo = _alfworld("TASPO", "eval_seen", [4, 2, 1, 3, 1, 1], [4, 2, 3, 5, 1, 1], [7, 5, 14, 9, 11, 20])
    lines = render_steps_table([grpo, taspo], bold_best=True).splitlines()
    assert lines[0] == "| Method | Pick | Look | Clean | Heat | Cool | Pick2 | All |"
    # GRPO overall: (3*8 + 6 + 2*10 + 12) / 7 = 62/7 = 8.857 -> 8.9; TASPO: (28 + 10 + 14 + 27 + 11 + 20) / 12 = 9.166
    # -> 9.2. Fewer steps is better, so the lower value is bold.
    assert lines[2] == "| GRPO | 8.0 | 6.0 | – | 10.0 | 12.0 | – | **8.9** |"
    assert lines[3] == "| TASPO | **7.0** | **5.0** | **14.0** | **9.0** | **11.0** | **20.0** | 9.2 |"


def test_webshop_and_search_tables():
    webshop = [
        {"env": "webshop", "model": "m", "method": "GRPO", "split": "test", "num_tasks": 8, "seed": 0, "groups": {},
         "overall": {"n": 8, "success": 0.625, "score": 0.7988, "mean_steps_success": 6.0}},
        {"env": "webshop", "model": "m", "method": "TASPO", "split": "test", "num_tasks": 8, "seed": 0, "groups": {},
         "overall": {"n": 8, "success": 0.75, "score": 0.885, "mean_steps_success": 5.5}},
    ]
    assert render_results_table(webshop) == (
        "| Method | Score | Succ. |\n|---|---:|---:|\n| GRPO | 79.9 | 62.5 |\n| TASPO | 88.5 | 75.0 |\n"
    )
    validation = dict(webshop[0], split="val")
    lines = render_results_table([*webshop, validation]).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| GRPO (test)", "| TASPO (test)", "| GRPO (val)"]

    def search(method: str, em: dict[str, float]) -> dict:
        groups = {name: {"n": 10, "success": v, "score": v, "mean_steps_success": 2.0} for name, v in em.items()}
        return {"env": "search", "model": "m", "method": method, "split": "test", "num_tasks": 10 * len(em),
                "seed": 0, "groups": groups, "overall": {"n": 10 * len(em), "success": 0.0, "score": 0.0,
                                                         "mean_steps_success": 2.0}}

    # Dataset names in any spelling land in Table 1's order; an unknown dataset comes after them.
    results = [
        search("GRPO", {"hotpotqa": 0.3, "2WikiMultiHopQA": 0.2, "nq": 0.4, "my_qa": 0.9}),
        search("TASPO", {"HotpotQA": 0.5, "NQ": 0.6, "bamboogle": 0.7}),
    ]
    lines = render_results_table(results).splitlines()
    assert lines[0] == "| Method | NQ | HotpotQA | 2Wiki | Bamboogle | my_qa | Avg. |"
    # Avg. is the macro-average over the row's datasets: (40 + 30 + 20 + 90) / 4 = 45.0; (60 + 50 + 70) / 3 = 60.0
    assert lines[2] == "| GRPO | 40.0 | 30.0 | 20.0 | – | 90.0 | 45.0 |"
    assert lines[3] == "| TASPO | 60.0 | 50.0 | – | 70.0 | – | 60.0 |"


def test_groups_table_of_a_registered_environment(tmp_path, capsys):
    def lockers(method: str, split: str, wins: dict[str, tuple[int, int]]) -> dict:
        groups = {name: {"n": n, "success": w / n, "score": w / n, "mean_steps_success": 1.0}
                  for name, (w, n) in wins.items()}
        won, total = sum(w for w, _ in wins.values()), sum(n for _, n in wins.values())
        return {"env": "lockers", "model": "m", "method": method, "split": split, "num_tasks": total, "seed": 0,
                "groups": groups, "overall": {"n": total, "success": won / total, "score": won / total,
                                              "mean_steps_success": 1.0}}

    results = [lockers("GRPO", "test", {"small": (1, 4), "big": (3, 4)}), lockers("TASPO", "test", {"big": (1, 2)})]
    # Groups sorted by name; All = 4/8 = 50.0 and 1/2 = 50.0; TASPO has no "small" group.
    assert render_groups_table(results) == (
        "| Method | big | small | All |\n|---|---:|---:|---:|\n"
        "| GRPO | 75.0 | 25.0 | 50.0 |\n| TASPO | 50.0 | – | 50.0 |\n"
    )
    with pytest.raises(ValueError, match="unknown env 'lockers'.*render_groups_table"):
        render_results_table(results)
    path = tmp_path / "lockers_test.json"
    path.write_text(json.dumps(results[0]))
    assert main(["table", str(path)]) == 0
    assert "| GRPO | 75.0 | 25.0 | 50.0 |" in capsys.readouterr().out


def test_latex_table_groups_splits_and_escapes():
    seen = _alfworld("GRPO_v2", "eval_seen", [1] * 6, [2] * 6, [5.0] * 6)
    unseen = _alfworld("GRPO_v2", "eval_unseen", [0] * 6, [2] * 6, [None] * 6)
    latex = render_results_table([seen, unseen], fmt="latex")
    assert latex.startswith("\\begin{tabular}{l" + "r" * 14 + "}\n\\toprule\n")
    assert " & \\multicolumn{7}{c}{Seen} & \\multicolumn{7}{c}{Unseen} \\\\" in latex
    assert "\\cmidrule(lr){2-8} \\cmidrule(lr){9-15}" in latex
    assert "GRPO\\_v2 & " + " & ".join(["50.0"] * 7 + ["0.0"] * 7) + " \\\\" in latex
    assert latex.rstrip().endswith("\\bottomrule\n\\end{tabular}")
    steps = render_steps_table([unseen], fmt="latex")
    assert "GRPO\\_v2 & " + " & ".join(["--"] * 7) + " \\\\" in steps


def test_rows_name_the_model_only_when_a_method_has_several():
    a = _alfworld("GRPO", "eval_seen", [1] * 6, [1] * 6, [3.0] * 6)
    # taspo-eval records checkpoint paths as models: different methods are told apart by method alone.
    lines = render_results_table([dict(a, model="outputs/grpo"), dict(a, model="outputs/taspo", method="TASPO")])
    assert [line.split(" | ")[0] for line in lines.splitlines()[2:]] == ["| GRPO", "| TASPO"]
    lines = render_results_table([a, dict(a, model="qwen2.5-3b")]).splitlines()
    assert lines[2].startswith("| smollm2-135m / GRPO | 100.0 |")
    assert lines[3].startswith("| qwen2.5-3b / GRPO | 100.0 |")


def test_table_errors():
    a = _alfworld("GRPO", "eval_seen", [1] * 6, [1] * 6, [3.0] * 6)
    webshop = {"env": "webshop", "model": "m", "method": "GRPO", "split": "test", "groups": {},
               "overall": {"n": 1, "success": 1.0, "score": 1.0, "mean_steps_success": 3.0}}
    with pytest.raises(ValueError, match="no evaluation results"):
        render_results_table([])
    with pytest.raises(ValueError, match="mix environments"):
        render_results_table([a, webshop])
    with pytest.raises(ValueError, match="unknown env 'babyai'"):
        render_results_table([dict(a, env="babyai")])
    with pytest.raises(ValueError, match="two results for 'smollm2-135m / GRPO' on split 'eval_seen'"):
        render_results_table([a, dict(a)])
    with pytest.raises(ValueError, match="two results for 'm / GRPO' on split 'test'"):
        render_results_table([webshop, dict(webshop)])
    with pytest.raises(ValueError, match="fmt must be"):
        render_results_table([a], fmt="html")
    with pytest.raises(ValueError, match="ALFWorld's"):
        render_steps_table([webshop])


# ---------------------------------------------------------------------------------------------------------------
# command line


def test_cli_curves_and_table(tmp_path, capsys):
    _write_state(tmp_path / "grpo", _log_history([0.0, 0.5]))
    _write_state(tmp_path / "taspo", _log_history([0.5, 1.0]))
    out = tmp_path / "curves.png"
    assert main(["curves", str(tmp_path / "grpo"), str(tmp_path / "taspo"), "--out", str(out),
                 "--metrics", "success/all", "kl"]) == 0
    assert _png_size(out) == (800, 300)

    result = tmp_path / "grpo_seen.json"
    result.write_text(json.dumps(_alfworld("GRPO", "eval_seen", [1, 1, 1, 1, 1, 0], [2] * 6, [4.0] * 5 + [None])))
    table_out = tmp_path / "tables" / "table.md"
    assert main(["table", str(result), "--out", str(table_out)]) == 0
    text = table_out.read_text()
    assert text.startswith("#### Success rate (%)\n\n| Method | Pick |")
    # 5 wins out of 12 tasks -> 41.7%; mean steps 4.0 everywhere but Pick2 (no success)
    assert "| GRPO | 50.0 | 50.0 | 50.0 | 50.0 | 50.0 | 0.0 | 41.7 |" in text
    assert "#### Mean steps of successful episodes" in text
    assert "| GRPO | 4.0 | 4.0 | 4.0 | 4.0 | 4.0 | – | 4.0 |" in text

    capsys.readouterr()
    assert main(["table", str(result), "--format", "latex"]) == 0
    assert "\\begin{tabular}" in capsys.readouterr().out


def test_cli_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["curves", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    bogus = tmp_path / "bogus.json"
    bogus.write_text(json.dumps({"accuracy": 1}))
    assert main(["table", str(bogus)]) == 2
    assert "expected a taspo-eval result" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plot"])


def test_seeds_of_a_method_pool_into_mean_and_t_interval(tmp_path, capsys):
    """Three seeds of TASPO (overall success 50, 60 and 70 %) against one GRPO run: by hand, mean 60, sample
    standard deviation 10, half-width t(2) 4.303 x 10 / sqrt(3) = 24.8."""
    paths = []
    for seed, wins in enumerate(([1, 1, 1, 0, 1, 1], [1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1])):
        n = [2, 2, 2, 2, 1, 1]
        result = _alfworld("TASPO", "eval_unseen", wins, n, [3.0] * 6)
        result["overall"]["success"] = (0.5, 0.6, 0.7)[seed]
        result["model"] = f"outputs/taspo_seed{seed}"
        paths.append(tmp_path / f"taspo_{seed}.json")
        paths[-1].write_text(json.dumps(result))
    grpo = tmp_path / "grpo.json"
    grpo.write_text(json.dumps(_alfworld("GRPO", "eval_unseen", [1] * 6, [2] * 6, [3.0] * 6)))
    assert main(["table", str(grpo), *map(str, paths), "--seeds"]) == 0
    out = capsys.readouterr().out
    taspo = next(line for line in out.splitlines() if line.startswith("| TASPO (3 seeds)"))
    assert taspo.endswith("| 60.0 ± 24.8 |")  # the All column
    assert "| 50.0 ± 0.0 |" in taspo  # Pick: 1 of 2 in every seed, no spread
    assert "mean ± half-width of its 95 % t-interval" in out
    assert next(line for line in out.splitlines() if line.startswith("| GRPO")).endswith("| 50.0 |")
    same = [str(p) for p in paths]
    for path in same:  # one checkpoint evaluated with three sampling seeds: refused without --seeds
        data = json.loads(Path(path).read_text())
        Path(path).write_text(json.dumps(dict(data, model="outputs/taspo")))
    assert main(["table", *same]) == 2
    assert "--seeds where they are seeds of one method" in capsys.readouterr().err

