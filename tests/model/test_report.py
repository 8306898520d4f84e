"""Reports (loss curves, tables, samples, attention maps), provenance and terminal output."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.paths import ROOT
from tests.support.processes import run_module
from tests.support.tiny import TINY_FLAGS, tiny_yaml
from tinygpt import report
from tinygpt.base import config
from tinygpt.data import prepare_from_config
from tinygpt.training import progress, trainer


def png_content(path):
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
    return img


def test_bigram_baseline_beats_uniform_on_structured_text(tmp_path):
    corpus = tmp_path / "abc.txt"
    corpus.write_text("abc" * 2000)
    prepared = prepare_from_config("pydoc", str(corpus), str(tmp_path / "data"))
    assert report.bigram_val_loss(prepared) < 0.01 < math.log(3)


def test_sweep_report_has_curves_table_samples_and_attention(tmp_path, tiny_corpus):
    spec = tmp_path / "rep.yaml"
    train = tiny_yaml(max_steps=30, eval_interval=10, sample_tokens=60)
    spec.write_text(f"name: rep\ntrain: {{data_file: {tiny_corpus}, {train}}}\ngrid: {{lr: [3.0e-3, 1.0e-2]}}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    done = subprocess.run([sys.executable, str(ROOT / "launch.py"), str(spec), "--local", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = subprocess.run([sys.executable, str(ROOT / "launch.py"), "report", str(spec), "--workdir", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "runs" / "rep"
    text = (folder / "report.md").read_text()
    for name in ("lr-0.003", "lr-0.01"):
        assert f"| `{name}` |" in text and f"### {name}" in text
    assert "count-based bigram" in text and "uniform guess, ln(" in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    best = [float(r.split("|")[4]) for r in rows]
    assert len(rows) == 2 and best == sorted(best)  # best first
    curves = png_content(folder / "val_loss.png")
    attention = png_content(folder / "attention.png")
    for img in (curves, attention):
        assert img[..., :3].std() > 0.05  # not a blank canvas
        assert len(np.unique(img[..., :3].reshape(-1, 3).round(2), axis=0)) > 20  # lines, colours, text


def test_single_run_report_and_its_errors(tmp_path, tiny_corpus):
    run_dir = tmp_path / "one"
    trainer.train(config.resolve([*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(run_dir),
                                "--data-dir", str(tmp_path / "d"), "--sample-tokens", "30"]))
    out = run_module("tinygpt.report", "--run", str(run_dir), "--prompt", "ROMEO: love")
    assert out.returncode == 0, out.stderr
    assert "ROMEO: love" in (run_dir / "report.md").read_text()
    png_content(run_dir / "attention.png")
    bad = run_module("tinygpt.report", "--run", str(tmp_path / "nothing"))
    assert bad.returncode == 1 and "is this a run directory" in bad.stderr and "Traceback" not in bad.stderr


def test_provenance_records_code_software_and_command(tmp_path, tiny_corpus):
    run_dir = tmp_path / "p"
    argv = [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(run_dir), "--data-dir", str(tmp_path / "d")]
    trainer.train(config.resolve([*argv, "--stop-after", "10"]))
    trainer.train(config.resolve(argv))
    starts = json.loads((run_dir / "provenance.json").read_text())["starts"]
    assert len(starts) == 2  # one record per life of the run
    p = starts[0]
    assert p["git"]["commit"] is None or len(p["git"]["commit"]) == 40
    assert p["python"].count(".") == 2 and p["torch"] and p["hostnames"] and p["command"]
    assert {"cuda", "nccl", "gpus", "slurm", "world_size"} <= p.keys()


@pytest.mark.parametrize("damage", [b"\x00\xff not json", b"[1, 2]", b'{"starts": 3}'])
def test_a_damaged_provenance_file_is_set_aside_never_overwritten(tmp_path, damage):
    from tinygpt.training import provenance

    path = tmp_path / "provenance.json"
    for life in range(2):  # damaged twice: both damaged versions are kept
        path.write_bytes(damage + b" " * (life + 1))  # (trailing blanks keep valid JSON valid)
        provenance.append(tmp_path, {"life": life})
        assert json.loads(path.read_text()) == {"starts": [{"life": life}]}
    assert (tmp_path / "provenance.json.corrupt").read_bytes() == damage + b" "
    assert (tmp_path / "provenance.json.corrupt.1").read_bytes() == damage + b"  "


def test_plain_progress_lines_are_greppable(capsys):
    bar = progress.PlainLines(max_steps=2000, min_interval_s=0).start(0)
    bar.step(250, {"train_loss": 2.04123, "lr": 9.7e-4, "tokens_per_s": 48113.2, "mfu": 0.312, "eta_s": 72})
    assert capsys.readouterr().out == ("step  250/2000 | loss 2.0412 | lr 9.70e-04 | 48,113 tok/s | mfu 31.2% | "
                                       "eta 1m12s\n")


def test_rich_progress_bar_shows_loss_speed_mfu_and_eta():
    from rich.console import Console

    console = Console(record=True, width=100, force_terminal=True)  # pinned width
    bar = progress.RichBar(max_steps=100, console=console).start(0)
    bar.step(50, {"train_loss": 1.5, "tokens_per_s": 12345, "mfu": 0.25})
    bar.bar.refresh()
    bar.close()
    text = console.export_text()
    assert "50/100" in text and "loss 1.5000" in text and "12,345 tok/s" in text and "mfu 25.0%" in text


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (75, "1m15s"), (3700, "1h01m"), (None, "?")])
def test_durations(seconds, text):
    assert progress.format_duration(seconds) == text


def test_the_mask_exercise_section_shows_the_unmasked_run_reading_the_answer_and_failing_to_generate(tmp_path,
                                                                                                  tiny_corpus):
    """Two runs of one shape, with and without the causal mask: the report ranks the unmasked one but says why,
    draws its attention maps, and scores both runs' samples with the causal model."""
    runs = []
    for name, causal in (("base", "true"), ("no-mask", "false")):
        out = tmp_path / name
        trainer.train(config.resolve([*TINY_FLAGS, "--max-steps", "60", "--data-file", str(tiny_corpus),
                                      "--out-dir", str(out), "--data-dir", str(tmp_path / "data"), "--causal", causal]))
        runs.append(report.load_run(out))
    text = report.write_report(runs, tmp_path / "report", "mask", ["causal"]).read_text()
    assert "`no-mask` (no causal mask: reads the answer)" in text
    assert "## Attention maps of the best run (`base`)" in text  # the best causal run
    assert "## Without the causal mask: `no-mask` against `base`" in text
    png_content(tmp_path / "report" / "attention_no-mask.png")
    rows = {line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:4]] for line in text.splitlines()
            if line.startswith("| training loss at step 60") or line.startswith("| `base`'s loss per character")}
    train_unmasked, train_base = rows["training loss at step 60"]
    on_unmasked, on_own = rows["`base`'s loss per character on a 400-character sample of each"]
    assert train_unmasked < train_base  # it reads the answer
    assert on_unmasked > on_own  # and what it writes is not the language the causal model learnt
