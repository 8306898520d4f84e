"""The caching CPU allocator (tinygpt/cpu_allocator.py, csrc/caching_allocator.cpp) and malloc's fallback:
blocks reused by size, memory held within its bound, PyTorch's allocator back after uninstall, the profiler's
view, threads, and the trainer's choice (bit-identical training either way; a failed build is in
test_cpu_kernels.py's no-compiler test)."""

import subprocess
import sys
import threading

import pytest
import torch

from conftest import TINY_FLAGS, loss_series, python_env, read_metrics, run_module
from tinygpt import cpu_allocator

MiB = 1 << 20


def run_python(code: str, *args: str, **env: str) -> str:
    """stdout of `python -c code args` in the project's environment without the caller's MALLOC_* settings
    (plus `env`), which must exit 0."""
    base = {k: v for k, v in python_env().items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env={**base, **env},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def caching():
    assert cpu_allocator.install("caching", say=lambda _: None) == "caching"
    try:
        yield
    finally:
        cpu_allocator.uninstall()


def test_freed_blocks_are_reused_by_exact_size_and_small_ones_go_to_malloc(caching):
    start = cpu_allocator.stats()
    assert start["installed"] == 1
    a = torch.arange(MiB, dtype=torch.float32)  # 4 MiB
    ptr = a.data_ptr()
    assert a[-1].item() == MiB - 1 and ptr % 64 == 0
    del a
    b = torch.zeros(MiB)
    assert b.data_ptr() == ptr and b.sum().item() == 0  # the same block, handed out again
    c = torch.empty(MiB + 1024)  # another page count: another block
    assert c.data_ptr() != ptr
    small = torch.ones(1000)
    assert small.data_ptr() % 64 == 0 and small.sum().item() == 1000
    now = cpu_allocator.stats()
    assert now["hits"] - start["hits"] == 1 and now["misses"] - start["misses"] == 2
    # whole pages, one more for the header: 4 MiB + 1 page, 4 MiB + 4 KiB + 1 page
    assert now["live_bytes"] - start["live_bytes"] == (4 * MiB + 4096) + (4 * MiB + 2 * 4096)
    # PyTorch's raw_allocate path (some kernels take scratch memory that way) and a big matmul's result
    x = torch.randn(512, 1024)
    torch.testing.assert_close(torch.nn.functional.gelu(x), 0.5 * x * (1 + torch.erf(x / 2**0.5)))
    torch.testing.assert_close((x @ x.T).diag(), (x * x).sum(1))


def test_memory_held_stays_within_twice_the_live_peak(caching):
    """Sizes that never repeat (a growing prompt): kept blocks of old sizes are unmapped, not piled up."""
    for i in range(200):
        t = torch.empty(MiB // 4 + 4096 * i)  # 1 MiB and 16 KiB more each time
        del t
    s = cpu_allocator.stats()
    assert s["mapped_bytes"] <= 2 * s["peak_live_bytes"] and s["unmapped_bytes"] > 100 * MiB, s
    # A repeating pattern (a training step) is served from kept blocks only, after the first round.
    for round_ in range(3):
        before = cpu_allocator.stats()["misses"]
        held = [torch.empty(MiB // 2 * k) for k in (1, 2, 3, 2, 1)]
        del held
        if round_:
            assert cpu_allocator.stats()["misses"] == before
    assert cpu_allocator.empty_cache() > 0 and cpu_allocator.stats()["kept_bytes"] == 0


def test_uninstall_gives_pytorchs_allocator_back_and_frees_what_outlived_it():
    assert cpu_allocator.install("caching", say=lambda _: None) == "caching"
    survivor = torch.full((2 * MiB,), 3.0)
    kept = torch.empty(MiB)
    del kept
    cpu_allocator.uninstall()
    assert cpu_allocator.stats() is None
    later = torch.empty(2 * MiB)  # PyTorch's allocator again: not this block
    assert later.data_ptr() != survivor.data_ptr() and survivor.sum().item() == 6 * MiB
    del survivor  # freed through the caching allocator's deleter, now unmapped


def test_threads_allocating_at_once_leave_consistent_counts(caching):
    errors = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(150):
            n = int(torch.randint(MiB // 4, 3 * MiB // 4, (1,), generator=g))
            t = torch.full((n,), float(seed))
            if t[0].item() != seed or t[-1].item() != seed:
                errors.append(seed)
            del t

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = cpu_allocator.stats()
    assert not errors and s["hits"] + s["misses"] >= 600
    assert s["live_bytes"] < 64 * MiB, s  # all freed again (the pytest process may hold a few of its own)


def test_the_profiler_sees_its_memory(caching):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        t = torch.ones(2 * MiB)
        del t
    usage = {e.key: e.cpu_memory_usage for e in prof.key_averages()}
    assert any(v >= 8 * MiB for v in usage.values()), usage


OUT_OF_MEMORY = """
import resource, torch
from tinygpt import cpu_allocator
assert cpu_allocator.install("caching", say=lambda _: None) == "caching"
before = cpu_allocator.stats()["mapped_bytes"]
vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
try:
    torch.empty(1 << 28)  # 1 GiB: over the limit
except torch.OutOfMemoryError as err:
    print(str(err).splitlines()[0])
assert cpu_allocator.stats()["mapped_bytes"] == before  # nothing counted for the failed block
t = torch.ones(4 << 20)  # 16 MiB still fits
print(int(t.sum()), cpu_allocator.stats()["mapped_bytes"] - before)
"""


def test_out_of_memory_is_pytorchs_error_and_leaves_the_allocator_usable():
    """A real failed mmap: the address space limited (RLIMIT_AS) below the request."""
    oom, after = run_python(OUT_OF_MEMORY).splitlines()
    assert oom.startswith("CPU out of memory: tried to allocate 1073741824 bytes (Cannot allocate memory)"), oom
    assert after == f"{4 << 20} {16 * MiB + 4096}"


FORK_WHILE_LOCKED = """
import os, time, torch
from tinygpt import cpu_allocator
assert cpu_allocator.install("caching", say=lambda _: None) == "caching"
cpu_allocator._ext._hold_lock_for_test(0.3)  # another thread is in the middle of an allocation
pid = os.fork()
if pid == 0:
    os._exit(0 if torch.ones(1 << 20).sum().item() == 1 << 20 else 3)  # 4 MiB: takes the lock
for _ in range(1000):  # up to 10 s
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print(os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    print("the child hung")
"""


def test_a_fork_while_another_thread_allocates_leaves_the_child_working():
    assert run_python(FORK_WHILE_LOCKED).strip() == "0"


FAULTS_OF_FRESH_BLOCKS = """
import resource, sys, torch
from tinygpt import cpu_allocator
if sys.argv[1] != "default":
    assert cpu_allocator.install(sys.argv[1], say=lambda _: None) == sys.argv[1]
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a step's activations: six blocks of argv[2] bytes, all freed at its end
    blocks = [torch.ones(int(sys.argv[2]) // 4) for _ in range(6)]
    del blocks
step(); step()  # (malloc's heap settles)
before = faults()
for _ in range(20):
    step()
print(faults() - before)
"""


@pytest.mark.parametrize("block", [8 * MiB, MiB // 2], ids=["8MiB-caching's", "512KiB-malloc's"])
def test_kept_blocks_are_not_faulted_in_again_every_step(block):
    """Blocks of 1 MiB and more are the caching allocator's; smaller ones stay malloc's, which keeps them too."""
    faults = {}
    for mode in ("default", "malloc", "caching"):
        # glibc handing every block back: its fixed initial threshold (by default it adapts, unpredictably)
        extra = {"MALLOC_MMAP_THRESHOLD_": "131072"} if mode == "default" else {}
        faults[mode] = int(run_python(FAULTS_OF_FRESH_BLOCKS, mode, str(block), **extra))
    every_page = 20 * 6 * (block // 4096)
    assert faults["default"] >= every_page, faults  # each step faults each page in again
    assert faults["malloc"] * 8 < every_page, faults  # the heap keeps them (measured: 2-16k of 245k, settling)
    assert faults["caching"] * 8 < every_page, faults  # (measured: 0 for 8 MiB blocks)


def test_malloc_stays_as_the_user_set_it():
    code = ("from tinygpt import cpu_allocator as a; print(a.keep_freed_memory(), a.install('auto'), "
            "a.install('caching', say=lambda _: None))")
    out = run_python(code, MALLOC_ARENA_MAX="2")
    assert out.split() == ["False", "malloc", "caching"], out  # asked for by name: installed


def test_training_is_bit_identical_on_either_allocator(tmp_path, tiny_corpus):
    """A model whose activations take the caching allocator's path (1 MiB and more)."""
    flags = [*TINY_FLAGS, "--n-embd", "128", "--n-head", "4", "--block-size", "64", "--batch-size", "32",
             "--max-steps", "6", "--eval-interval", "3", "--log-interval", "1", "--data-file", str(tiny_corpus),
             "--data-dir", str(tmp_path / "data")]
    runs = {}
    for mode in ("caching", "malloc"):
        done = run_module("tinygpt.train", *flags, "--out-dir", str(tmp_path / mode), "--cpu-allocator", mode)
        assert done.returncode == 0, done.stderr
        assert f"cpu allocator {mode}" in done.stdout
        records = read_metrics(tmp_path / mode)
        assert records[0]["cpu_allocator"] == mode
        runs[mode] = (loss_series(tmp_path / mode), records[-1]["weights_digest"], records[-1]["cpu_allocator_stats"])
    assert runs["caching"][:2] == runs["malloc"][:2]
    stats = runs["caching"][2]
    assert stats["hits"] > 5 * stats["misses"] > 0, stats  # after the first step, kept blocks serve it
    assert runs["malloc"][2] is None
