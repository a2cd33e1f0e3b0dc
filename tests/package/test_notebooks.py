"""The notebooks run top to bottom (quickstart on the tiny random-weight model) and produce what they promise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="executing the notebooks needs nbformat (the dev extra)")
nbclient = pytest.importorskip("nbclient", reason="executing the notebooks needs nbclient (the dev extra)")
pytest.importorskip("ipykernel", reason="executing the notebooks needs an ipykernel Python kernel (the dev extra)")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _execute(name: str, cwd: Path) -> nbformat.NotebookNode:
    """Run a copy of the notebook in ``cwd`` (the kernel inherits this process's environment variables)."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return notebook


def _streams(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def _png_outputs(notebook) -> list[str]:
    return [
        output.data["image/png"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type in ("display_data", "execute_result") and "image/png" in output.data
    ]


def _summary(notebook) -> dict:
    """The JSON line the notebook's last code cell prints."""
    last = [cell for cell in notebook.cells if cell.cell_type == "code"][-1]
    return json.loads(_streams(last).strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["quickstart.ipynb", "credit_anatomy.ipynb"])
def test_committed_notebooks_have_no_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the outputs before committing"
    parameters = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(parameters) == 1  # one parameter cell (papermill-compatible)


def test_credit_anatomy_runs_and_keeps_the_guarantees(tmp_path, monkeypatch):
    figure = tmp_path / "anatomy.png"
    monkeypatch.setenv("TASPO_NOTEBOOK_FIGURE", str(figure))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = _execute("credit_anatomy.ipynb", tmp_path)

    assert figure.read_bytes()[:8] == PNG_SIGNATURE
    assert len(_png_outputs(notebook)) == 2  # the method comparison and the tau / eps_w sweep
    summary = _summary(notebook)
    assert summary["taspo_mean_weight"] == pytest.approx([1.0] * 4, abs=1e-9)
    assert summary["alignopsd_token_weighted_mean"] == pytest.approx([1.0] * 4, abs=1e-9)
    for low, high in summary["taspo_range"]:
        assert 0.6 - 1e-9 <= low < 1.0 < high <= 1.4 + 1e-9  # eps_w = 0.4, and every trajectory is redistributed
    for low, high in summary["alignopsd_range"]:
        assert 0.5 - 1e-9 <= low < 1.0 < high <= 2.5 + 1e-9  # w = 0.5 + 0.5 x, x in [0, 4] (official box and mixing)


@pytest.mark.slow  # about 40 s: the notebook end to end; the trainer tests cover the training it shows
def test_quickstart_trains_on_the_tiny_model_and_shows_the_credit(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("TASPO_NOTEBOOK_MODEL", "tiny")
    monkeypatch.setenv("TASPO_NOTEBOOK_OUTPUT_DIR", str(out))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = _execute("quickstart.ipynb", tmp_path)

    summary = _summary(notebook)
    assert summary["model"] == "tiny" and summary["steps"] == 1
    # Scripted group: both winners and the loser that reached the drawer get PI, and their weights move.
    assert summary["with_pi"] == 3 and summary["redistributed"] == 3
    assert summary["mean_weights"] == pytest.approx([1.0] * 4, abs=1e-9)

    assert (out / "trainer_state.json").is_file()
    assert Path(summary["curves_png"]).read_bytes()[:8] == PNG_SIGNATURE
    assert len(_png_outputs(notebook)) == 2  # training curves and the per-turn credit bars
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    printed = "".join(_streams(cell) for cell in code)
    assert "[Privileged Guidance]" in printed
    assert "'taspo/fallback/no_pi'" in printed  # the live step's fallback counters are shown
