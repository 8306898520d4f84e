"""Text from a trained run, `python -m tinygpt.sample`: the same `sample_text` the trainer samples with as it trains.

    python -m tinygpt.sample --run runs/mine --prompt "ROMEO:" --tokens 400 --temperature 0.8 --top-k 20
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tinygpt.base import schema
from tinygpt.base.config import SAMPLE_TEMPERATURE, SAMPLE_TOP_K, RunConfig
from tinygpt.base.errors import blank_arguments, filesystem_message, not_utf8
from tinygpt.training.sampling import sample_text


def _problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the flags' values, every problem at once. The ranges are those of the trainer's own
    sample_* keys (one declaration, in config.py)."""
    def outside(key: str, value: float) -> str | None:
        return schema.outside(RunConfig.model_fields[key], value)

    temperature = outside("sample_temperature", args.temperature)
    tokens, top_k = outside("sample_tokens", args.tokens), outside("sample_top_k", args.top_k)
    blank = blank_arguments(parser()._actions, args, keep=("prompt",))  # (a prompt of spaces is one)
    return blank + [message for bad, message in (
        (not args.prompt, "--prompt: is empty; give at least one character to continue"),
        (temperature, f"--temperature: must be a number {temperature}, got {args.temperature}"),
        (tokens, f"--tokens: must be {tokens}, got {args.tokens}"),
        (top_k, f"--top-k: must be {top_k} (0: all characters), got {args.top_k}"),
        (not re.fullmatch(r"cpu|cuda(:\d+)?", args.device),
         f"--device: must be cpu, cuda or cuda:N, got {args.device!r}"),
    ) if bad]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tinygpt.sample", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory (its newest valid checkpoint is used)")
    parser.add_argument("--checkpoint", help="a specific checkpoint file instead of the newest")
    parser.add_argument("--prompt", default="\n", help="text to continue")
    parser.add_argument("--tokens", type=int, default=400, help="characters to generate")
    parser.add_argument("--temperature", type=float, default=SAMPLE_TEMPERATURE,
                        help=f"> 0; lower is more conservative (default {SAMPLE_TEMPERATURE})")
    parser.add_argument("--top-k", type=int, default=SAMPLE_TOP_K,
                        help=f"sample among the k likeliest (0: all; default {SAMPLE_TOP_K})")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if problems := not_utf8(argv):
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    problems = _problems(args)
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2

    from tinygpt.base.config import ConfigError, from_dict
    from tinygpt.data import DataError, prepare_from_config
    from tinygpt.training import checkpoint as ckpt  # (after the argument checks: --help stays fast without torch)
    from tinygpt.training.precision import PrecisionError, pick_device
    from tinygpt.training.train_state import model_from

    run = Path(args.run)
    try:
        device = pick_device(args.device)
        if not args.checkpoint and not run.is_dir():
            print(f"error: --run: {run} {'is not a folder' if run.exists() else 'does not exist'}; give a run's "
                  f"folder (runs/<sweep>/<run>, the one that holds checkpoints/)", file=sys.stderr)
            return 1
        if args.checkpoint:
            checkpoint = ckpt.load(args.checkpoint, required=("model",))
        else:
            checkpoint = ckpt.load_newest(run, lambda m: print(f"warning: {m}", file=sys.stderr), ("model",))
            if checkpoint is None:
                print(f"error: no valid checkpoint in {ckpt.checkpoint_dir(run)}; train first", file=sys.stderr)
                return 1
        cfg = from_dict(checkpoint.meta["config"])
        prepared = prepare_from_config(cfg.data.dataset, cfg.data.data_file, cfg.data.data_dir)
        model = model_from(checkpoint).to(device)
    except (ckpt.CheckpointError, DataError, ConfigError, PrecisionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # (the path is too long, a folder cannot be read, ...)
        print(f"error: {'--checkpoint' if args.checkpoint else '--run'}: {filesystem_message(err)}", file=sys.stderr)
        return 1
    unknown = sorted({ch for ch in args.prompt if ch not in set(prepared.vocab)})
    if unknown:
        print(f"warning: dropping characters the model never saw: {''.join(unknown)!r}", file=sys.stderr)
    text = sample_text(model, prepared, args.prompt, args.tokens, args.seed, device,
                       temperature=args.temperature, top_k=args.top_k or None)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
