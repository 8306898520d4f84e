"""`python -m tinygpt.launch.node.run_config MANIFEST INDEX`: on a node, as an array task starts, write its run's
config file from the sweep's manifest (the shared inputs, the run's own, its run directory) and print the
file's path, for the batch script to hand to `python -m tinygpt.train --config`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tinygpt.base import config as train_config
from tinygpt.base import durable
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.manifest import ManifestHead, RunRecord, load_run

USAGE = "usage: python -m tinygpt.launch.node.run_config MANIFEST INDEX"


def config_file(manifest: ManifestHead, run: RunRecord) -> Path:
    """The run's trainer config file, written (where it differs) from the manifest's shared inputs and its own."""
    cfg = train_config.build({**manifest.base, **run.own, "out_dir": run.out_dir})
    path = manifest.dirs.config(run.name)
    text = train_config.dump_yaml(cfg)
    if not path.is_file() or path.read_bytes() != text.encode():
        durable.write(path, text)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["config"]:  # (as manifest.py's `config MANIFEST INDEX` hands it on)
        argv = argv[1:]
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        path = config_file(*load_run(Path(argv[0]), int(argv[1])))
    except (LaunchError, IndexError, ValueError, OSError) as err:
        print(f"tinygpt: cannot find run {argv[1]} in {argv[0]}: {err}", file=sys.stderr)
        return 1
    except train_config.ConfigError as err:
        print(f"tinygpt: run {argv[1]} of {argv[0]}: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
