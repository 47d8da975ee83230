"""The README's Python example runs as written (real offline weights)."""

import os
import runpy
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "api.py"


@pytest.mark.slow
@pytest.mark.offline_weights
def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(os.environ, "HF_HUB_OFFLINE", "1")
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "features (1, 384)" in out and "own network (1, 8)" in out and "knn.k20.acc" in out
    assert (tmp_path / "runs" / "api_example" / "results.json").is_file()
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    code = EXAMPLE.read_text()
    assert code[code.index("from pathlib import Path"):] in readme  # the README shows the file as it is


@pytest.mark.slow
def test_the_own_model_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(EXAMPLE.parent / "own_model.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "backbone module:torch.nn.modules.container.Sequential 32" in out and "head output (4, 64)" in out
    assert "mlp@1 linear.acc" in out
    assert (tmp_path / "runs" / "own_model" / "results.csv").is_file()
