"""The parts of a sweep's waves that need no cluster (tinygpt/launch/heal/waves.py): the margin read again from the
spec before each wave, the heal job's wait for the first live task, and a damaged waves record. (On the cluster:
tests/cluster/test_waves.py.)"""

from types import SimpleNamespace

import pytest

from tinygpt.launch.errors import LaunchError
from tinygpt.launch.heal import waves
from tinygpt.launch.layout import SweepDirs
from tinygpt.launch.manifest import WavesRecord, load_waves


@pytest.mark.parametrize(("text", "margin"), [("name: s\nqueue_margin: 5\n", 5), ("name: s\n", 2),
                                               ("queue_margin: -1\n", 2), ("queue_margin: true\n", 2),
                                               ("- a list\n", 2), ("queue_margin: [\n", 2), (None, 2)])
def test_the_margin_is_the_spec_files_now_else_the_launchs(tmp_path, text, margin):
    spec = tmp_path / "s.yaml"
    if text is not None:
        spec.write_text(text)
    record = WavesRecord(scripts=[], margin=2)
    assert waves.margin_now(SimpleNamespace(spec=str(spec)), record) == margin


def test_the_heal_job_waits_for_the_first_of_at_most_sixteen_live_tasks_or_looks_again_later():
    live = [f"7_{t}" for t in range(20)]
    (dependency,) = waves.after_the_first_of(live)
    assert dependency == "--dependency=" + "?".join(f"afterany:7_{t}" for t in range(waves.LIVE_MAX))
    assert waves.after_the_first_of([]) == [f"--begin={waves.LOOK_AGAIN}"]


def test_a_damaged_waves_record_is_one_clear_message(tmp_path):
    dirs = SweepDirs(tmp_path, "s")
    assert load_waves(dirs) is None
    dirs.jobs.mkdir(parents=True)
    dirs.waves.write_text('{"format": 1, "scripts": [{"script": "a.sbatch", "offset": 0')
    with pytest.raises(LaunchError, match=r"waves.json: the waves record is damaged \(not JSON: .*\), so the"):
        load_waves(dirs)
    dirs.waves.write_text('{"format": 1, "scripts": [{"script": "a.sbatch", "offset": "0", "indices": [0]}]}')
    with pytest.raises(LaunchError, match=r"damaged \(scripts\[0\]\.offset: expected a whole number"):
        load_waves(dirs)
    dirs.waves.write_text('{"format": 1, "scripts": [{"script": "a.sbatch", "offset": 0, "indices": [0, 1]}]}')
    assert load_waves(dirs).scripts[0].indices == [0, 1]
