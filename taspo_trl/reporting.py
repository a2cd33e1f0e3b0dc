"""Training curves and result tables in the shape of the TASPO / AlignOPSD papers.

    load_log_history        a run's logged metrics: HF ``trainer_state.json`` (output or checkpoint dir) or JSONL
    plot_training_curves    Figures 4-5: one panel per metric, one line per run, optional EMA smoothing
    render_results_table    Table 1: ALFWorld families (seen | unseen), WebShop Score / Succ., Search-QA EM + Avg.
    render_steps_table      Table 4's "ALF Steps": mean steps of successful ALFWorld episodes per family
    render_groups_table     success per task group, for an environment the papers have no table for (yours)
    main                    the ``taspo-report`` command (``curves`` and ``table``)

An evaluation result is the JSON written by ``taspo-eval``: ``env``, ``model``, ``method``, ``split`` and
``groups`` / ``overall`` entries with ``n``, ``success``, ``score`` and ``mean_steps_success``. ``success`` and
``score`` are fractions in [0, 1]; the tables show them in percent, as the papers do.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jsonl import json_lines

__all__ = [
    "DEFAULT_CURVE_METRICS",
    "load_log_history",
    "main",
    "plot_training_curves",
    "render_groups_table",
    "render_results_table",
    "render_steps_table",
]

PathLike = str | Path

# Figures 4-5: outcome (success, reward), optimisation stability (policy KL, only logged when beta != 0) and the
# spread of the credit weights. Weight means are left out: TASPO's are one by construction (Eq. 6).
DEFAULT_CURVE_METRICS: tuple[str, ...] = (
    "success/all",
    "reward",
    "kl",
    "taspo/weight_std",
    "credit/weight_min",
    "credit/weight_max",
    "alignopsd/alpha_mean",
)

_METRIC_TITLES = {
    "success/all": "Success rate",
    "reward": "Reward",
    "kl": "Policy KL",
    "taspo/weight_std": "TASPO weight std",
    "taspo/weight_mean": "TASPO weight mean",
    "credit/weight_min": "Min credit weight",
    "credit/weight_max": "Max credit weight",
    "alignopsd/alpha_mean": "AlignOPSD correction strength (alpha)",
    "loss": "Loss",
    "pi/coverage": "PI coverage",
    "taspo/fallback/no_pi": "TASPO fallback: no PI",
}

PAPER_ENVS: tuple[str, ...] = ("alfworld", "webshop", "search")
"""The environments with a Table 1 layout (``render_results_table``); others get ``render_groups_table``."""

ALFWORLD_FAMILIES: tuple[tuple[str, str], ...] = (
    ("pick_and_place_simple", "Pick"),
    ("look_at_obj_in_light", "Look"),
    ("pick_clean_then_place_in_recep", "Clean"),
    ("pick_heat_then_place_in_recep", "Heat"),
    ("pick_cool_then_place_in_recep", "Cool"),
    ("pick_two_obj_and_place", "Pick2"),
)

# Table 1's Search-QA column order; keys are normalised dataset names (lowercase, alphanumerics only).
SEARCH_DATASETS: tuple[tuple[str, str], ...] = (
    ("nq", "NQ"),
    ("triviaqa", "TriviaQA"),
    ("popqa", "PopQA"),
    ("hotpotqa", "HotpotQA"),
    ("2wiki", "2Wiki"),
    ("musique", "MuSiQue"),
    ("bamboogle", "Bamboogle"),
)
_SEARCH_ALIASES = {"2wikimultihopqa": "2wiki", "2wikimqa": "2wiki", "naturalquestions": "nq", "trivia": "triviaqa"}

# Seen before unseen, as the paper lays out its matched reruns; other split names follow alphabetically.
_SPLIT_ORDER = ("eval_seen", "valid_seen", "seen", "eval_unseen", "valid_unseen", "unseen")

# A missing cell: an en dash, as in the papers' tables ("--" is LaTeX's spelling of it).
_MISSING = {"markdown": "–", "latex": "--"}


# ----------------------------------------------------------------------------------------------------------------
# logs


def load_log_history(run_dir_or_file: PathLike) -> list[dict[str, Any]]:
    """The logged metric dicts of one training run, oldest first.

    Accepts an HF Trainer output directory (its ``trainer_state.json``, else the one of its latest
    ``checkpoint-<step>`` folder), a checkpoint directory, a ``trainer_state.json`` file (its ``log_history``),
    a JSON list of log dicts, or a JSONL file with one log dict per line.

    Raises:
        FileNotFoundError: nothing of the above at that path.
        ValueError: the file does not hold log dicts (the message says what was expected).
    """
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = _state_file_in(path)
    elif not path.is_file():
        raise FileNotFoundError(f"{path}: no such run directory or log file.")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return _jsonl_logs(text, path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # A .log / .txt file of JSON lines is still a JSONL log.
        return _jsonl_logs(text, path)
    if isinstance(data, dict) and "log_history" in data:
        data = data["log_history"]
    if not isinstance(data, list) or not all(isinstance(entry, dict) for entry in data):
        raise ValueError(
            f"{path}: expected a trainer_state.json with a 'log_history' list, a JSON list of log dicts, or a "
            "JSONL file of log dicts."
        )
    return data


def _state_file_in(directory: Path) -> Path:
    state = directory / "trainer_state.json"
    if state.is_file():
        return state
    # save_strategy="steps" without a final save_state() leaves the history only in the checkpoints; the
    # latest one holds the complete history up to its step.
    checkpoints = []
    for child in directory.glob("checkpoint-*"):
        match = re.fullmatch(r"checkpoint-(\d+)", child.name)
        if match and (child / "trainer_state.json").is_file():
            checkpoints.append((int(match.group(1)), child / "trainer_state.json"))
    if checkpoints:
        return max(checkpoints)[1]
    jsonl = sorted(directory.glob("*.jsonl"))
    if len(jsonl) == 1:
        return jsonl[0]
    raise FileNotFoundError(
        f"{directory}: expected a trainer_state.json (HF Trainer output or checkpoint directory), a "
        "checkpoint-<step>/trainer_state.json, or exactly one *.jsonl log file; found none."
    )


def _jsonl_logs(text: str, path: Path) -> list[dict[str, Any]]:
    logs = []
    for number, entry in json_lines(text.splitlines(), path):
        if not isinstance(entry, dict):  # malformed file content, not a bad argument: a ValueError
            message = f"{path}:{number}: expected a JSON object (one log dict per line), got {type(entry).__name__}."
            raise ValueError(message)  # noqa: TRY004
        logs.append(entry)
    return logs


# ----------------------------------------------------------------------------------------------------------------
# curves


def plot_training_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]] | Sequence[PathLike] | PathLike,
    out_png: PathLike,
    metrics: Sequence[str] = DEFAULT_CURVE_METRICS,
    smoothing: float = 0.0,
    x_key: str = "step",
    columns: int = 3,
    panel_size: tuple[float, float] = (4.0, 3.0),
    dpi: int = 100,
) -> list[str]:
    """Training curves like the papers' Figures 4-5: one panel per metric, one line per run.

    Args:
        runs: ``{label: log_history}``, or one or more paths accepted by ``load_log_history`` (labelled by
            their folder or file name).
        out_png: the PNG to write (parent folders are created).
        metrics: logged metric names; those no run logged are skipped.
        smoothing: EMA factor in [0, 1) (TensorBoard's debiased form); with smoothing the raw values are drawn
            faintly behind the smoothed line.
        x_key: the log key used as x axis (``step``); entries without it or without the metric are left out.
        columns, panel_size, dpi: layout: at most ``columns`` panels per row, each ``panel_size`` inches;
            the PNG is (min(columns, panels) x rows) panels of ``panel_size * dpi`` pixels.

    Returns:
        The metrics that were plotted, in panel order.

    Raises:
        ValueError: no run logged any of ``metrics``, no runs, or a bad ``smoothing``.
        ImportError: matplotlib is not installed (the ``report`` extra).
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}.")
    histories = _named_histories(runs)
    series: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for metric in metrics:
        by_run = {name: _series(logs, metric, x_key) for name, logs in histories.items()}
        series[metric] = {name: xy for name, xy in by_run.items() if xy[0]}  # runs that never logged it drop out
    plotted = [metric for metric in metrics if series[metric]]
    if not plotted:
        raise ValueError(
            f"none of the metrics {list(metrics)} was logged (with {x_key!r}) by the runs {list(histories)}; "
            "pass metrics= with names from their log history."
        )

    # The object API with an explicit Agg canvas: no pyplot state, so a notebook's backend stays untouched.
    # Imported here so the tables work without matplotlib.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as error:
        raise ImportError("plotting training curves needs matplotlib: pip install 'taspo-trl[report]'.") from error

    ncols = min(columns, len(plotted))
    nrows = math.ceil(len(plotted) / ncols)
    figure = Figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.subplots(nrows, ncols, squeeze=False).ravel()
    colors = [f"C{k % 10}" for k in range(len(histories))]
    for ax, metric in zip(axes, plotted):
        for color, name in zip(colors, histories):
            if name not in series[metric]:
                continue
            xs, ys = series[metric][name]
            if smoothing > 0:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=1)
                ax.plot(xs, _ema(ys, smoothing), color=color, label=name)
            else:
                ax.plot(xs, ys, color=color, marker="o" if len(xs) < 20 else None, markersize=3, label=name)
        ax.set_title(_METRIC_TITLES.get(metric, metric))
        ax.set_xlabel(x_key)
        if x_key == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps, not fractions of one
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(plotted) :]:
        ax.set_visible(False)
    figure.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=dpi)
    return plotted


def _named_histories(
    runs: Mapping[str, Sequence[Mapping[str, Any]]] | Sequence[PathLike] | PathLike,
) -> dict[str, Sequence[Mapping[str, Any]]]:
    if isinstance(runs, Mapping):
        histories = dict(runs)
    else:
        if isinstance(runs, (str, Path)):  # one path, not a sequence of one-character paths
            runs = [runs]
        paths = [Path(p) for p in runs]
        names = [p.name if p.name != "trainer_state.json" else p.parent.name for p in paths]
        # Two runs named alike (e.g. seed folders under different methods) keep their full paths as labels.
        if len(set(names)) < len(names):
            names = [str(p) for p in paths]
        histories = {name: load_log_history(p) for name, p in zip(names, paths)}
    if not histories:
        raise ValueError("no runs to plot.")
    return histories


def _series(logs: Sequence[Mapping[str, Any]], metric: str, x_key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for entry in logs:
        x, y = entry.get(x_key), entry.get(metric)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def _ema(values: list[float], smoothing: float) -> list[float]:
    # Debiased EMA: without the 1 - s^k correction the first points would be pulled towards zero.
    out, average = [], 0.0
    for k, value in enumerate(values, start=1):
        average = smoothing * average + (1 - smoothing) * value
        out.append(average / (1 - smoothing**k))
    return out


# ----------------------------------------------------------------------------------------------------------------
# tables


# Two-sided 95 % quantiles of Student's t by degrees of freedom (beyond 30 the normal 1.96 is within 4 %).
_T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
          12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


class Estimate(float):
    """A mean over seeds that carries the half-width ``half`` of its 95 % t-interval; compares and sorts as the
    mean."""

    half: float

    def __new__(cls, mean: float, half: float) -> Estimate:
        value = super().__new__(cls, mean)
        value.half = half
        return value


def seed_estimate(values: Sequence[float]) -> Estimate:
    """The mean of per-seed ``values`` with the half-width of its 95 % t-interval (sample standard deviation over
    the square root of n, times t at n - 1 degrees of freedom; the largest tabulated quantile at or below it)."""
    n = len(values)
    if n < 2:
        raise ValueError("an interval over seeds needs at least two seeds.")
    mean = sum(values) / n
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    t = _T_975[max(df for df in _T_975 if df <= n - 1)] if n - 1 <= 30 else 1.96
    return Estimate(mean, t * sd / n**0.5)


def combine_seeds(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Results of one method on one split (several training or sampling seeds) pooled into one result whose
    ``success``, ``score`` and ``mean_steps_success`` are ``Estimate``s over the seeds, per group and overall;
    its ``method`` says how many seeds. A method with one result on a split stays as it is."""
    by_key: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for result in results:
        by_key.setdefault((str(result.get("env")), str(result.get("method")), str(result.get("split"))), []).append(result)
    combined = []
    for (env, method, split), runs in by_key.items():
        if len(runs) == 1:
            combined.append(dict(runs[0]))
            continue

        def pooled(entries: list[Mapping[str, Any]]) -> dict[str, Any]:
            entry: dict[str, Any] = {"n": [e.get("n") for e in entries]}
            for name in ("success", "score", "mean_steps_success"):
                values = [e[name] for e in entries if e.get(name) is not None]
                entry[name] = seed_estimate(values) if len(values) > 1 else (values[0] if values else None)
            return entry

        groups = sorted({name for run in runs for name in run.get("groups", {})})
        combined.append({
            "env": env, "method": f"{method} ({len(runs)} seeds)", "split": split,
            "model": runs[0].get("model") if len({r.get("model") for r in runs}) == 1 else "several",
            "groups": {name: pooled([r["groups"][name] for r in runs if name in r.get("groups", {})]) for name in groups},
            "overall": pooled([r["overall"] for r in runs]),
        })
    return combined


@dataclass
class _Table:
    """A format-independent table: optional header groups (label, span) over the value columns."""

    columns: list[str]
    rows: list[tuple[str, list[float | None]]]
    groups: list[tuple[str, int]] | None
    lower_is_better: bool = False


def render_results_table(
    results: Sequence[Mapping[str, Any]], fmt: str = "markdown", digits: int = 1, bold_best: bool = False
) -> str:
    """Table 1 of the papers: one row per method, for one environment.

    ALFWorld: success (%) of Pick, Look, Clean, Heat, Cool, Pick2 and All (the overall success), one block of
    columns per split (seen before unseen) when results of several splits are given. WebShop: Score and Succ.
    (%). Search-QA: exact match (%) per dataset in Table 1's order (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki,
    MuSiQue, Bamboogle; other datasets after them; a dataset's EM is its group's ``success``) and Avg., their
    macro-average. Rows are keyed by method (plus model, when one method comes with several models; plus split,
    for WebShop and Search-QA results of several splits); a missing cell shows "–".

    Args:
        results: evaluation JSON dicts (``taspo-eval`` output), all of the same ``env``.
        fmt: ``"markdown"`` or ``"latex"`` (booktabs).
        digits: decimals of the percentages.
        bold_best: bold the best value of every column (ties all bold), as the papers do.

    Raises:
        ValueError: no results, mixed or unknown environments, two results for the same method and split,
            or an unknown ``fmt``.
    """
    env = _common_env(results)
    if env == "alfworld":
        table = _split_table(results, lambda entry: entry.get("success"), scale=100.0)
    elif env == "webshop":
        table = _webshop_table(results)
    else:
        table = _search_table(results)
    return _render(table, fmt, digits, bold_best)


def render_steps_table(
    results: Sequence[Mapping[str, Any]], fmt: str = "markdown", digits: int = 1, bold_best: bool = False
) -> str:
    """Table 4's "ALF Steps": mean environment steps of successful ALFWorld episodes, per family and All.

    Same layout as the ALFWorld results table (rows = methods, splits side by side); ``null`` (no success)
    shows "–"; with ``bold_best`` the lowest value of a column is bold (fewer steps is better).
    """
    env = _common_env(results)
    if env != "alfworld":
        raise ValueError(f"the mean-steps table is ALFWorld's (Table 4); got env={env!r}.")
    table = _split_table(results, lambda entry: entry.get("mean_steps_success"), scale=1.0)
    table.lower_is_better = True
    return _render(table, fmt, digits, bold_best)


def render_groups_table(
    results: Sequence[Mapping[str, Any]], fmt: str = "markdown", digits: int = 1, bold_best: bool = False
) -> str:
    """Success (%) per task group (the trajectories' ``task_type``, sorted by name) and "All" (the overall
    success), one row per method (per method and split when results of several splits are given): the table of
    an environment the papers have none for, such as one you registered. Raises as ``render_results_table``."""
    _common_env(results, known=None)
    names = sorted({str(name) for result in results for name in result.get("groups", {})})
    rows = []
    for label, result in _labelled_rows(results):
        groups = result.get("groups", {})
        entries = [groups.get(name) for name in names] + [result.get("overall")]
        rows.append((label, [_scaled(e.get("success"), 100.0) if e else None for e in entries]))
    return _render(_Table(names + ["All"], rows, None), fmt, digits, bold_best)


def _common_env(results: Sequence[Mapping[str, Any]], known: tuple[str, ...] | None = PAPER_ENVS) -> str:
    if not results:
        raise ValueError("no evaluation results to tabulate.")
    envs = {r.get("env") for r in results}
    if len(envs) != 1:
        raise ValueError(f"results mix environments {sorted(map(str, envs))}; render one table per environment.")
    env = envs.pop()
    if known is not None and env not in known:
        raise ValueError(
            f"unknown env {env!r}: expected 'alfworld', 'webshop' or 'search' (render_groups_table tabulates any "
            "environment)."
        )
    return env


def _row_labels(results: Sequence[Mapping[str, Any]]) -> list[str]:
    # taspo-eval's "model" is the checkpoint path, different for every trained method, so rows are named by
    # method; the model joins the name only where one method was evaluated with several models (backbones).
    methods = [str(r.get("method")) for r in results]
    keys = [(method, str(r.get("split"))) for method, r in zip(methods, results)]
    if len(set(keys)) == len(keys):
        return methods
    return [f"{r.get('model')} / {method}" for method, r in zip(methods, results)]


def _split_key(split: str) -> tuple[int, str]:
    return (_SPLIT_ORDER.index(split), split) if split in _SPLIT_ORDER else (len(_SPLIT_ORDER), split)


def _split_table(
    results: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], Any], scale: float
) -> _Table:
    splits = sorted({str(r.get("split")) for r in results}, key=_split_key)
    cells: dict[str, dict[str, Mapping[str, Any]]] = {}
    for label, result in zip(_row_labels(results), results):
        by_split = cells.setdefault(label, {})
        split = str(result.get("split"))
        if split in by_split:
            raise ValueError(f"two results for {label!r} on split {split!r}; pass one per method and split, or "
                             "--seeds where they are seeds of one method (mean ± 95 % interval)")
        by_split[split] = result
    columns = [short for _, short in ALFWORLD_FAMILIES] + ["All"]
    rows = []
    for label, by_split in cells.items():
        values: list[float | None] = []
        for split in splits:
            result = by_split.get(split, {})
            groups = result.get("groups", {})
            entries = [groups.get(family) for family, _ in ALFWORLD_FAMILIES] + [result.get("overall")]
            values += [_scaled(value(e) if e else None, scale) for e in entries]
        rows.append((label, values))
    groups = [(split.removeprefix("eval_").capitalize(), len(columns)) for split in splits] if len(splits) > 1 else None
    return _Table(columns * len(splits), rows, groups)


def _webshop_table(results: Sequence[Mapping[str, Any]]) -> _Table:
    rows = []
    for label, result in _labelled_rows(results):
        overall = result.get("overall", {})
        rows.append((label, [_scaled(overall.get("score"), 100.0), _scaled(overall.get("success"), 100.0)]))
    return _Table(["Score", "Succ."], rows, None)


def _search_table(results: Sequence[Mapping[str, Any]]) -> _Table:
    known = dict(SEARCH_DATASETS)
    present: dict[str, str] = {}  # normalised name -> column label
    for result in results:
        for name in result.get("groups", {}):
            key = _dataset_key(name)
            present.setdefault(key, known.get(key, name))
    order = [key for key, _ in SEARCH_DATASETS if key in present]
    order += sorted((key for key in present if key not in known), key=lambda key: present[key].lower())
    rows = []
    for label, result in _labelled_rows(results):
        by_key = {_dataset_key(name): entry for name, entry in result.get("groups", {}).items()}
        values = [_scaled(by_key[key].get("success"), 100.0) if key in by_key else None for key in order]
        found = [v for v in values if v is not None]
        rows.append((label, values + [sum(found) / len(found) if found else None]))
    return _Table([present[key] for key in order] + ["Avg."], rows, None)


def _labelled_rows(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """One row per result; WebShop and Search-QA tables have one block of columns, so a split is a row."""
    labels = _row_labels(results)
    several_splits = len({str(r.get("split")) for r in results}) > 1
    seen: set[tuple[str, str]] = set()
    rows = []
    for label, result in zip(labels, results):
        split = str(result.get("split"))
        if (label, split) in seen:
            raise ValueError(f"two results for {label!r} on split {split!r}; pass one per method and split, or "
                             "--seeds where they are seeds of one method (mean ± 95 % interval)")
        seen.add((label, split))
        rows.append((f"{label} ({split})" if several_splits else label, result))
    return rows


def _dataset_key(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return _SEARCH_ALIASES.get(key, key)


def _scaled(value: Any, scale: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, Estimate):
        return Estimate(float(value) * scale, value.half * scale)
    return float(value) * scale


def _cell(value: float, digits: int) -> str:
    return f"{value:.{digits}f} ± {value.half:.{digits}f}" if isinstance(value, Estimate) else f"{value:.{digits}f}"


def _render(table: _Table, fmt: str, digits: int, bold_best: bool) -> str:
    if fmt not in ("markdown", "latex"):
        raise ValueError(f"fmt must be 'markdown' or 'latex', got {fmt!r}.")
    best = _best_cells(table) if bold_best else set()
    bold = (lambda text: f"**{text}**") if fmt == "markdown" else (lambda text: f"\\textbf{{{text}}}")
    body = [
        [label] + [
            _MISSING[fmt] if v is None else (bold(_cell(v, digits)) if (r, c) in best else _cell(v, digits))
            for c, v in enumerate(values)
        ]
        for r, (label, values) in enumerate(table.rows)
    ]
    return _markdown(table, body) if fmt == "markdown" else _latex(table, body)


def _best_cells(table: _Table) -> set[tuple[int, int]]:
    best = set()
    for c in range(len(table.columns)):
        column = [(values[c], r) for r, (_, values) in enumerate(table.rows) if values[c] is not None]
        if not column:
            continue
        target = min(v for v, _ in column) if table.lower_is_better else max(v for v, _ in column)
        best |= {(r, c) for v, r in column if v == target}
    return best


def _markdown(table: _Table, body: list[list[str]]) -> str:
    columns = table.columns
    if table.groups:
        # Markdown has no merged header cells, so each column names its split.
        labels = [label for label, span in table.groups for _ in range(span)]
        columns = [f"{column} ({label})" for column, label in zip(columns, labels)]
    lines = ["| Method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def _latex(table: _Table, body: list[list[str]]) -> str:
    lines = [f"\\begin{{tabular}}{{l{'r' * len(table.columns)}}}", "\\toprule"]
    if table.groups:
        spans = [f"\\multicolumn{{{span}}}{{c}}{{{_latex_escape(label)}}}" for label, span in table.groups]
        lines.append(" & " + " & ".join(spans) + " \\\\")
        rules, start = [], 2
        for _, span in table.groups:
            rules.append(f"\\cmidrule(lr){{{start}-{start + span - 1}}}")
            start += span
        lines.append(" ".join(rules))
    lines.append(" & ".join(["Method"] + [_latex_escape(c) for c in table.columns]) + " \\\\")
    lines.append("\\midrule")
    lines += [" & ".join([_latex_escape(row[0])] + row[1:]) + " \\\\" for row in body]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    return re.sub(r"([&%$#_{}])", r"\\\1", text)


# ----------------------------------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    """``taspo-report``: ``curves RUN... --out curves.png`` and ``table EVAL.json... [--out table.md]``."""
    parser = argparse.ArgumentParser(prog="taspo-report", description="Training curves and result tables.")
    commands = parser.add_subparsers(dest="command", required=True)
    curves = commands.add_parser("curves", help="plot training curves of one or more runs (Figures 4-5)")
    curves.add_argument("runs", nargs="+", help="run output dirs, checkpoint dirs, trainer_state.json or JSONL logs")
    curves.add_argument("--out", required=True, help="PNG file to write")
    curves.add_argument("--metrics", nargs="+", default=list(DEFAULT_CURVE_METRICS), help="logged metric names")
    curves.add_argument("--smoothing", type=float, default=0.0, help="EMA smoothing in [0, 1)")
    table = commands.add_parser("table", help="results table of evaluation JSONs (Table 1; ALFWorld adds Table 4)")
    table.add_argument("results", nargs="+", help="taspo-eval JSON files, all of one environment")
    table.add_argument("--out", help="file to write (default: print)")
    table.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    table.add_argument("--digits", type=int, default=1)
    table.add_argument("--bold-best", action="store_true", help="bold the best value of every column")
    table.add_argument("--seeds", action="store_true",
                       help="results of one method on one split are seeds: report their mean ± 95 %% t-interval")
    args = parser.parse_args(argv)

    try:
        if args.command == "curves":
            plotted = plot_training_curves(args.runs, args.out, metrics=args.metrics, smoothing=args.smoothing)
            print(f"wrote {args.out} ({', '.join(plotted)})")
            return 0
        results = [_read_result(path) for path in args.results]
        if args.seeds:
            results = combine_seeds(results)
        options = {"fmt": args.format, "digits": args.digits, "bold_best": args.bold_best}
        render = render_results_table if results[0].get("env") in PAPER_ENVS else render_groups_table
        text = render(results, **options)
        if results[0].get("env") == "alfworld":
            heading = "%" if args.format == "latex" else "####"
            text = (
                f"{heading} Success rate (%)\n\n{text}\n{heading} Mean steps of successful episodes\n\n"
                + render_steps_table(results, **options)
            )
        if any(isinstance(r.get("overall", {}).get("success"), Estimate) for r in results):
            note = "Cells over several seeds: mean ± half-width of its 95 % t-interval over the seeds."
            text += f"\n{'% ' if args.format == 'latex' else ''}{note}\n"
    except (FileNotFoundError, ImportError, ValueError) as error:
        print(f"taspo-report: {error}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _read_result(path: PathLike) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg}); expected a taspo-eval result file.") from None
    if not isinstance(data, dict) or "env" not in data or "overall" not in data:
        raise ValueError(f"{path}: expected a taspo-eval result with 'env', 'groups' and 'overall'.")
    return data


if __name__ == "__main__":
    sys.exit(main())
