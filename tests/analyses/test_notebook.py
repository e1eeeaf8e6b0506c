"""The notebook runs top to bottom in a fresh kernel (nbclient); any failing cell fails the test."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # the real SmolLM2 end to end

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "decompose_prediction.ipynb"


def test_decompose_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "sum of components" in printed and r"\toprule" in printed and "atp*: Spearman" in printed
    sums = re.search(r"sum of rows (\S+) = model logit (\S+)", printed)  # the features' decomposition is exact
    assert sums is not None and abs(float(sums[1]) - float(sums[2])) < 1e-3
    assert printed.count("promotes [") == 4 and "⟦" in printed  # each feature's tokens and top contexts
    figures = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
               if "application/vnd.plotly.v1+json" in out.get("data", {})]
    assert len(figures) == 6  # four decomposition figures, two patching heatmaps
    shown = "".join(out.get("data", {}).get("text/plain", "") for cell in nb.cells if cell.cell_type == "code"
                    for out in cell.outputs)
    assert "tuned" in shown  # the last cell's table sets both lenses side by side
    assert (tmp_path / "exports" / "ioi_heads.tex.json").exists()
