"""A Hugging Face Trainer script as people write one, knowing nothing of this project: HfArgumentParser over
TrainingArguments (--output_dir, --max_steps, --save_steps, --resume_from_checkpoint, ...), a model made from a
config (nothing downloaded), trainer.train(resume_from_checkpoint=...). It saves checkpoint-N folders every
save_steps and has no signal handler: the signal Slurm sends before the time limit ends it.

The test's knobs, for ends a real script meets: --fail_at N raises at step N (a bug); --hold_mb M holds M MB
from the start, its first life until Slurm kills it (more than the job's --mem: out of memory); --hold_at N: a
first life (not resumed) waits once it has logged step N until Slurm ends it, as a long step would (a test's time
to send the warning, on any machine)."""

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


@dataclass
class Knobs:
    hold_at: int = -1
    fail_at: int = -1
    hold_mb: int = 0


class Said(TrainerCallback):
    """Its losses printed, one line a logged step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"step {state.global_step}: loss {logs['loss']:.4f}", flush=True)
        if state.global_step == knobs.hold_at and args.resume_from_checkpoint is None:
            time.sleep(600)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == knobs.fail_at:
            raise ValueError(f"bad batch at step {state.global_step}: token id out of range")


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 16, (64, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


training_args, knobs = HfArgumentParser((TrainingArguments, Knobs)).parse_args_into_dataclasses()
if knobs.hold_mb:  # (4 bytes each, touched; a first life, no mark in output_dir, waits for Slurm to kill it)
    mark = Path(training_args.output_dir) / "held-once"
    first = not mark.exists()
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()  # (before the memory: Slurm may kill it while it fills)
    held = torch.ones(knobs.hold_mb * 2**18)
    if first:
        time.sleep(600)
model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1))
trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(), callbacks=[Said()])
trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
print(f"done at step {trainer.state.global_step}")
