"""A job chain from one call: data preparation, the training array after it, the sweep report after that."""

from pathlib import Path

import pytest

from tests.support.processes import launch
from tests.support.slurm import job_fields, manifest_of, wait, wait_until
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import tiny_yaml

TINY = tiny_yaml(max_steps=20, eval_interval=10, sample_tokens=40)


def chain_spec(tmp_path: Path, corpus: Path, name: str) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\ntrain: {{data_file: {corpus}, {TINY}}}\ngrid: {{lr: [1.0e-3, 3.0e-3]}}\n"
                    "resources: {time: '00:10:00'}\n")
    return spec


def test_a_local_chain_prepares_trains_and_reports_in_order(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    out = launch(str(chain_spec(tmp_path, tiny_corpus, "loc")), "--local", "--chain", "--workdir", str(work))
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert text.index("=== chain, data: prepared") < text.index("=== run 1/2") < text.index("=== chain, report:")
    assert (work / "runs" / "loc" / "report.md").is_file() and "report: " in text
    by_manifest = launch("status", str(sweep_dirs(work, "loc").manifest))  # no spec needed
    assert by_manifest.returncode == 0 and by_manifest.stdout.count("FINISHED") == 2, by_manifest.stdout


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_the_chain_runs_in_order_on_the_cluster_and_the_report_is_written(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    spec = chain_spec(tmp_path, tiny_corpus, "chained")
    out = launch(str(spec), "--chain", "--workdir", str(work))
    assert out.returncode == 0, out.stdout + out.stderr
    subs = manifest_of(work, "chained").submissions
    assert [s.role for s in subs] == ["data", None, "report"]
    data, array, report = (s.job_id for s in subs)
    assert f"submitted the chain: data job {data}, training array {array}, report job {report}" in out.stdout
    assert job_fields(f"{array}_0")["Dependency"].startswith(f"afterok:{data}") or wait(data) == "COMPLETED"
    assert job_fields(report)["Dependency"].startswith(f"afterany:{array}") or wait(array + "_1") == "COMPLETED"
    status = launch("status", str(spec), "--workdir", str(work))
    assert f"chain: data {data} " in status.stdout and f"-> training {array} -> report {report} " in status.stdout
    assert wait(report, timeout=300) == "COMPLETED"
    assert [wait(f"{array}_{i}") for i in (0, 1)] == ["COMPLETED", "COMPLETED"]
    log = (work / "logs" / "chained" / f"data-{data}.out").read_text()
    assert "vocabulary" in log  # tinygpt.data prepare's own line
    report_md = (work / "runs" / "chained" / "report.md").read_text()
    assert "lr-0.001" in report_md and "## Efficiency (sacct)" in report_md


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_cancel_cancels_the_whole_chain(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    spec = chain_spec(tmp_path, tiny_corpus, "stopped")
    assert launch(str(spec), "--chain", "--hold", "--workdir", str(work)).returncode == 0
    ids = [s.job_id for s in manifest_of(work, "stopped").submissions]
    again = launch(str(spec), "--chain", "--workdir", str(work))
    assert again.returncode == 1 and "the chain's data step (job" in again.stderr
    cancelled = launch("cancel", str(spec), "--workdir", str(work))
    assert cancelled.returncode == 0 and all(i in cancelled.stdout for i in ids)
    wait_until(lambda: all(wait(i, timeout=60) == "CANCELLED" for i in (ids[0], f"{ids[1]}_0", ids[2])),
               timeout=90, what="every job of the chain cancelled")
