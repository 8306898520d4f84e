"""Rank detection, rendezvous from Slurm variables, and real 2-process DDP (gloo on CPU)."""

import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.support.processes import free_port, python_env, ranks, run_world
from tests.support.tiny import COURSE_SCHEDULE, TINY_FLAGS, loss_series, read_metrics
from tinygpt.launch.submit import fork_server
from tinygpt.training import distributed as d
from tinygpt.training.schedule import ONECYCLE_DIV


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node1", ["node1"]),
        ("gpu[001-004,010],cpu7", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "cpu7"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
        ("a,b[2-3]", ["a", "b2", "b3"]),
    ],
)
def test_nodelist_fallback_parser(nodelist, hosts):
    assert d.expand_nodelist(nodelist) == hosts


def slurm_env(**kw):
    env = {"SLURM_JOB_ID": "123456", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[007-008]"}
    env.update(kw)
    return env


def test_slurm_env_gives_rank_master_and_job_derived_port(monkeypatch):
    monkeypatch.setattr(d.shutil, "which", lambda name: None)  # as inside a container: no scontrol
    env = d.detect(slurm_env())
    assert (env.rank, env.world_size, env.local_rank, env.launcher) == (3, 8, 1, "slurm")
    assert env.master_addr == "gpu007"
    assert env.master_port == d.port_for_job("123456") == 20000 + 123456 % 20000
    assert d.port_for_job("123457") != env.master_port  # a neighbouring job does not collide


def test_master_address_and_port_from_the_environment_win(monkeypatch):
    monkeypatch.setattr(d.shutil, "which", lambda name: None)
    env = d.detect(slurm_env(MASTER_ADDR="10.0.0.5", MASTER_PORT="4242"))
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 4242)


def test_torchrun_env_comes_first():
    env = d.detect({**slurm_env(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                    "MASTER_PORT": "29501"})
    assert (env.rank, env.world_size, env.launcher, env.master_port) == (1, 2, "torchrun", 29501)


def test_batch_shell_and_single_task_steps_are_single_processes():
    assert d.detect({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}).launcher == "single"
    assert d.detect(slurm_env(SLURM_NTASKS="1", SLURM_PROCID="0")).world_size == 1
    assert d.detect({}).launcher == "single"


def trainer_args(tmp_path, corpus, out, *extra) -> list[str]:
    return [*TINY_FLAGS, "--data-file", str(corpus), "--out-dir", str(out), "--data-dir", str(tmp_path / "data"),
            *extra]


def torchrun(tmp_path, corpus, out, *extra, **env):
    """A two-rank run under torchrun itself, as users start one."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "tinygpt.train", *trainer_args(tmp_path, corpus, out, *extra)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300,  # (torchrun's log folders: in tmp_path)
                            env=python_env(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), **env))
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def two_ranks(tmp_path, corpus, out, *extra) -> subprocess.CompletedProcess:
    """A two-rank run to its end, its ranks forked warm with torchrun's variables (fork_server.py): for the
    tests of what ranks do, not of how they are started."""
    result = run_world("tinygpt.train", trainer_args(tmp_path, corpus, out, *extra),
                              python_env(OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.distributed
def test_ranks_whose_bf16_probes_disagree_orthogonalise_in_rank_0s_dtype_and_stay_in_sync(tmp_path, tiny_corpus):
    """Each rank times the probe itself; ranks that stepped Muon in different dtypes would drift apart."""
    out = tmp_path / "muon"
    by_rank = python_env(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tests" / "support" / "probe_by_rank"))
    result = run_world("tinygpt.train", trainer_args(tmp_path, tiny_corpus, out, "--optimizer", "muon"), by_rank)
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_metrics(out)
    assert records[0]["muon_precision"] == "bf16" and "0.50x" in records[0]["muon_precision_why"]
    digests = records[-1]["weights_digest"]
    assert len(digests) == 2 and digests[0] == digests[1]


@pytest.mark.distributed
def test_two_ranks_of_ddp_around_the_compiled_model_stay_in_sync_and_rank0_alone_writes(tmp_path, tiny_corpus):
    """The GPU's default path on gloo: DDP around the compiled model (aot_eager: Dynamo and AOTAutograd, no
    code generation; tests/training/test_gpu_path.py)."""
    out = tmp_path / "ddp"
    result = torchrun(tmp_path, tiny_corpus, out, "--dropout", "0.1", "--compile", "on", "--compile-backend",
                      "aot_eager", TORCH_LOGS="recompiles")
    records = read_metrics(out)
    start, finished = records[0], records[-1]
    assert start["world_size"] == 2 and start["launcher"] == "torchrun" and start["compile"]
    # DDP's optimizer splits the graph at its buckets on purpose; what must not happen is a recompile per
    # step. Each rank recompiles once: for evaluation (eval mode, no grad), at its first one.
    recompiles = [line for line in result.stderr.splitlines() if "Recompiling function" in line]
    assert len(recompiles) == 2, "\n".join(recompiles)
    assert start["tokens_per_step"] == 4 * 16 * 2  # global batch = batch_size * grad_accum * world_size
    digests = finished["weights_digest"]
    assert len(digests) == 2 and digests[0] == digests[1]
    steps = [r["step"] for r in records if "lr" in r]
    assert steps == sorted(set(steps))  # one writer: no step logged twice
    assert result.stdout.count("done: step 20") == 1
    assert "global batch: 4 x 1 accum x 2 ranks = 8 sequences" in result.stdout


@pytest.mark.distributed
@pytest.mark.parametrize("optimizer", [["--optimizer", "adamw", *COURSE_SCHEDULE], ["--optimizer", "muon"]],
                         ids=["adamw-onecycle", "muon"])
def test_two_rank_run_stopped_and_resumed_is_identical(tmp_path, tiny_corpus, optimizer):
    whole, part = tmp_path / "whole", tmp_path / "part"
    common = ["--dropout", "0.1", "--log-interval", "1", "--grad-accum", "2", *optimizer]
    two_ranks(tmp_path, tiny_corpus, whole, *common)
    two_ranks(tmp_path, tiny_corpus, part, *common, "--stop-after", "10")
    two_ranks(tmp_path, tiny_corpus, part, *common)
    assert loss_series(whole) == loss_series(part)
    if "onecycle" in optimizer:  # (the schedule reached the ranks: OneCycleLR starts at its peak rate / 25)
        rates = [r["lr"] for r in read_metrics(whole) if "lr" in r]
        assert rates[0] == pytest.approx(max(rates) / ONECYCLE_DIV)
    assert read_metrics(whole)[-1]["weights_digest"] == read_metrics(part)[-1]["weights_digest"]


@pytest.mark.distributed
def test_resume_with_another_world_size_rederives_the_data_streams(tmp_path, tiny_corpus):
    from tinygpt.base import config
    from tinygpt.training import trainer

    out = tmp_path / "grow"
    trainer.train(config.resolve([*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                                "--data-dir", str(tmp_path / "data"), "--stop-after", "10"]))
    result = two_ranks(tmp_path, tiny_corpus, out)
    assert "written by 1 ranks, this run has 2" in result.stdout
    assert read_metrics(out)[-1]["event"] == "finished"


@pytest.mark.slurm_release
@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_two_nodes_under_srun_find_the_master_from_the_nodelist_and_stay_in_sync(tmp_path, tiny_corpus):
    from tests.support.slurm import train_on_two_nodes

    out = tmp_path / "srun"
    job = train_on_two_nodes(tmp_path, "ddp2n", [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                                                 "--data-dir", str(tmp_path / "data"), "--dropout", "0.1"])
    records = read_metrics(out)
    start, finished = records[0], records[-1]
    assert start["launcher"] == "slurm" and start["world_size"] == 2
    assert len(set(start["hostnames"])) == 2  # one rank on each node
    master_host = start["master"].split(":")[0]
    assert master_host == start["hostnames"][0] == "node1"  # first host of SLURM_JOB_NODELIST
    assert start["master"].split(":")[1] == str(d.port_for_job(job))
    assert finished["weights_digest"][0] == finished["weights_digest"][1]
    steps = [r["step"] for r in records if "lr" in r]
    assert steps == sorted(set(steps))
    assert (tmp_path / "ddp2n.out").read_text().count("done: step 20") == 1


@pytest.mark.parametrize("world_size, leaves_by", [("2", ["exit hooks", "os._exit"]), ("1", ["sys.exit"])])
def test_a_distributed_rank_skips_python_finalisation_at_exit(monkeypatch, world_size, leaves_by):
    """Finalisation ran the collective library's C++ destructors, which aborted a finished rank ~1 in 20. Its
    exit hooks run first all the same (sys.exit's path runs them as Python ends)."""
    import tinygpt.train as train_mod

    calls = []

    def leave(how):
        def fake(code):
            calls.append((how, code))
            raise SystemExit(code)  # neither returns
        return fake

    monkeypatch.setenv("WORLD_SIZE", world_size)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(train_mod.os, "_exit", leave("os._exit"))
    monkeypatch.setattr(train_mod.sys, "exit", leave("sys.exit"))
    monkeypatch.setattr(train_mod.atexit, "_run_exitfuncs", lambda: calls.append(("exit hooks", None)))
    # (its signals are the process's: ignored in this one, every process the worker started later would ignore them)
    monkeypatch.setattr(train_mod.preemption, "ignore_from_now_on", lambda: None)
    with pytest.raises(SystemExit):
        train_mod.exit_process(75)
    assert [how for how, _ in calls] == leaves_by and calls[-1][1] == 75


def one_rank(tmp_path, corpus, rank: int, world: int, port: int, timeout: float = 4, **env) -> fork_server.Forked:
    """One rank of a torchrun-style world, started alone (its peers never come)."""
    args = trainer_args(tmp_path, corpus, tmp_path / f"rank{rank}", "--join-timeout", str(timeout))
    return fork_server.Forked("tinygpt.train", args,
                              python_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env))


@pytest.mark.distributed
def test_a_join_that_cannot_complete_ends_in_its_time_naming_the_master_and_the_missing_ranks(tmp_path, tiny_corpus):
    port = free_port()
    alone = one_rank(tmp_path, tiny_corpus, 0, 3, port)  # ranks 1 and 2 never start
    nobody = one_rank(tmp_path, tiny_corpus, 1, 2, free_port())  # no rank 0 serves the rendezvous (at once)
    _, err = alone.communicate(timeout=120)
    assert alone.returncode == 1 and "Traceback" not in err, err
    assert f"rank(s) 1, 2 of 3 never arrived at the master 127.0.0.1:{port} within 4 s" in err, err
    _, err = nobody.communicate(timeout=120)
    assert nobody.returncode == 1 and "Traceback" not in err, err
    assert "rank 1 on " in err and "could not reach the master at 127.0.0.1:" in err and "within 4 s" in err, err


def test_a_loopback_master_for_a_job_on_several_nodes_is_refused_before_anything_waits(tmp_path, tiny_corpus):
    two_nodes = one_rank(tmp_path, tiny_corpus, 0, 2, free_port(), timeout=600, LOCAL_WORLD_SIZE="1")
    _, err = two_nodes.communicate(timeout=120)  # (it would wait 600 s if it did not refuse)
    assert two_nodes.returncode == 1 and "Traceback" not in err, err
    assert "the master address 127.0.0.1 is the loopback of each machine, but the job spans 2 nodes" in err, err
    assert d.detect({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}).nodes == 2
    assert d.detect({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "2",
                     "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "7"}).nodes == 2


@pytest.mark.distributed
def test_a_stopped_rank_ends_the_run_with_the_live_ranks_stacks_and_a_hung_record_then_it_resumes(
        tmp_path, tiny_corpus):
    import os
    import signal
    import time

    from tests.support.slurm import wait_until

    whole, hung = tmp_path / "whole", tmp_path / "hung"
    flags = ["--max-steps", "100", "--hang-timeout", "3", "--ckpt-interval", "20", "--eval-interval", "50"]
    two_ranks(tmp_path, tiny_corpus, whole, *flags)
    rank0, rank1 = ranks("tinygpt.train", trainer_args(tmp_path, tiny_corpus, hung, *flags),
                                python_env(OMP_NUM_THREADS="1"))
    wait_until(lambda: len([r for r in (read_metrics(hung) if (hung / "metrics.jsonl").exists() else [])
                            if "lr" in r]) >= 8, timeout=120, what="40 steps")
    os.kill(rank1.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        _, err = rank0.communicate(timeout=180)
    finally:
        rank1.kill()  # (as torchrun does when rank 0 leaves)
    print(f"\nstopped rank 1: rank 0 ended {time.monotonic() - stopped_at:.1f} s later")
    assert rank0.returncode != 0
    assert "error: rank 0 on " in err and "for 3 s (hang_timeout)" in err and "no answer from rank(s) 1" in err, err
    assert "Thread 0x" in err and "(most recent call first)" in err  # rank 0's stacks
    last = read_metrics(hung)[-1]
    assert last["event"] == "hung" and last["rank"] == 0 and last["silent_ranks"] == [1], last
    two_ranks(tmp_path, tiny_corpus, hung, *flags)  # the next life resumes from the newest checkpoint
    resumed, uninterrupted = read_metrics(hung)[-1], read_metrics(whole)[-1]
    assert resumed["weights_digest"] == uninterrupted["weights_digest"]
    assert resumed["best_val_loss"] == uninterrupted["best_val_loss"]


def test_a_silent_peer_is_killed_only_after_the_message_the_stacks_and_the_hung_record(tmp_path, monkeypatch,
                                                                                          capfd):
    """Killing a stopped rank closes its sockets, and this rank's main thread, waiting in a collective with it,
    raises at once: were the peer killed before the watchdog has said why, that error could end the process first,
    with a traceback and no hung record. The order is a race between two threads, so it is checked here by
    looking at what is written at the moment of the kill."""
    import socket

    from tinygpt.training import watchdog

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 40, "lr": 0.001}\n')
    at_the_kill = []
    monkeypatch.setattr(watchdog, "_end_peer", lambda pid: at_the_kill.append((pid, metrics.read_text(),
                                                                               capfd.readouterr().err)))

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(watchdog.os, "_exit", exit_)
    dog = watchdog.Watchdog(0, rank=0, world_size=2, metrics_path=metrics, store=None)
    monkeypatch.setattr(dog, "_bounded_roll_call", lambda: watchdog.RollCall({1: socket.gethostname()}, True, [4321]))
    dog.beat(40)
    with pytest.raises(SystemExit) as ended:
        dog._end()
    assert ended.value.code == watchdog.EXIT_HUNG
    [(pid, written, said)] = at_the_kill
    assert pid == 4321 and '"event": "hung"' in written and '"silent_ranks": [1]' in written, written
    assert "no answer from rank(s) 1" in said and "(most recent call first)" in said, said  # (its stacks)
