"""hpc_lab's notebook as a student runs it: a real Jupyter kernel, the library (`tinygpt.launch.api`) alone, the
local cluster; and the library's answers equal to the command's `--json` for the same sweep."""

import json

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support.paths import ROOT
from tests.support.processes import launch, python_env
from tests.support.slurm import cancel
from tests.support.tiny import tiny_train
from tinygpt.launch import api

pytestmark = [pytest.mark.slurm, pytest.mark.shares_cluster]  # (its jobs wait for CPUs like any other's)

NOTEBOOK = ROOT / "hpc_lab" / "06_notebook" / "sweep.ipynb"


def with_parameters(notebook: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    """The notebook with a cell of `source` after its cell tagged `parameters` (papermill's convention)."""
    at = next(i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", []))
    notebook.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    return notebook


def test_the_notebook_launches_waits_and_plots_a_sweep_through_the_library(tmp_path, tiny_corpus):
    workdir = tmp_path / "work"
    train = {**tiny_train(max_steps=20, eval_interval=10, log_interval=5), "data_file": str(tiny_corpus)}
    notebook = with_parameters(nbformat.read(NOTEBOOK, as_version=4),
                               f"workdir = Path({str(workdir)!r})\ntrain = {train!r}")
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=python_env())
    finally:
        if (workdir / "notebook-lr.yaml").exists():
            cancel(*[s.job_id for s in api.open_sweep(workdir / "notebook-lr.yaml", workdir).manifest.submissions])
    said = "".join(o.get("text", "") + json.dumps(o.get("data", {})) for c in notebook.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "'lr-0.001': ('COMPLETED', 20," in said and "'lr-0.003': ('COMPLETED', 20," in said, said
    assert (workdir / "losses.png").stat().st_size > 10_000  # (the two curves drawn, not an empty figure)

    sweep = api.open_sweep(workdir / "notebook-lr.yaml", workdir)  # the spec the notebook's mapping became
    cli = launch("status", str(workdir / "notebook-lr.yaml"), "--workdir", str(workdir), "--json")
    assert cli.returncode == 0, cli.stderr
    assert {**sweep.status().model_dump(), "time": 0} == {**json.loads(cli.stdout), "time": 0}
    assert [len([r for r in records if "lr" in r]) for records in sweep.metrics().values()] == [4, 4]
    listed = launch("list", "--workdir", str(workdir), "--json")
    assert [e.model_dump(exclude_none=True) for e in api.list_sweeps(workdir)] == json.loads(listed.stdout)["sweeps"]
    logs = sweep.logs("lr-0.003")
    shown = launch("logs", str(workdir / "notebook-lr.yaml"), "lr-0.003", "--workdir", str(workdir)).stdout
    assert len(logs) == 1 and logs[0].text.startswith("tinygpt: run 1 (") and logs[0].text in shown
    assert "runs/notebook-lr/lr-0.003" in logs[0].text
    report = sweep.report()
    assert report == workdir / "runs" / "notebook-lr" / "report.md" and "lr-0.003" in report.read_text()
