"""karpathy/nanoGPT's train.py as the launcher meets it, its habits without its model (standard library only, so
that a test pays no torch import): every `--key=value` word split on `=` and read into a global (a word with a
second `=` is its ValueError), prepared data read from `data/<dataset>/train.bin` beside the code, a checkpoint
`ckpt.pt` written in out_dir at each evaluation, a resume only when told (`--init_from=resume`), no handler for
any signal, and progress printed, never written as JSON:

    step 10: train loss 2.9801, val loss 3.0456

Its losses are a function of the step and the learning rate alone, so a run resumed from its checkpoint prints
what an unbroken one prints. (A test's hook, no habit of nanoGPT's: with NANO_LIKE_HOLD set, it waits after its
first checkpoint until a signal ends it, so that a test's signal finds it training on any machine.)"""

import ast
import json
import os
import signal
import sys
import time

out_dir = "out"
dataset = "tiny"
init_from = "scratch"
learning_rate = 1e-3
max_iters = 40
eval_interval = 10
step_s = 0.0  # (seconds each iteration takes)

for arg in sys.argv[1:]:  # (nanoGPT's configurator.py, in short)
    key, val = arg.split("=")
    key = key[2:]
    assert key in globals(), f"Unknown config key: {key}"
    try:
        globals()[key] = ast.literal_eval(val)
    except (SyntaxError, ValueError):
        globals()[key] = val

with open(os.path.join("data", dataset, "train.bin"), "rb") as f:
    data = f.read()

iter_num = 0
if init_from == "resume":
    with open(os.path.join(out_dir, "ckpt.pt")) as f:
        iter_num = json.load(f)["iter_num"]
    print(f"resuming training from {out_dir} at iter {iter_num}")
os.makedirs(out_dir, exist_ok=True)


def loss(step: int, split: float) -> float:
    return round(4.0 / (1 + learning_rate * 100 * step) + split + len(data) * 1e-4, 4)


while True:
    if iter_num % eval_interval == 0:
        print(f"step {iter_num}: train loss {loss(iter_num, 0.0):.4f}, val loss {loss(iter_num, 0.05):.4f}")
        if iter_num > 0:
            with open(os.path.join(out_dir, "ckpt.pt"), "w") as f:
                json.dump({"iter_num": iter_num}, f)
            if os.environ.get("NANO_LIKE_HOLD"):
                signal.pause()
    if iter_num >= max_iters:
        break
    time.sleep(step_s)
    print(f"iter {iter_num}: loss {loss(iter_num, 0.0):.4f}")
    iter_num += 1
