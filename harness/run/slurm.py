"""The sbatch script for a multi-node sweep: slurm allocates the nodes, the runner drives one
``srun`` step per row (one task per node, each a torchrun joined by a c10d rendezvous on the first
node), and writes the records exactly as on one host. The sweep directory must be on a filesystem
every node shares (the ranks' evidence is read from it)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.run.recipes import Recipe


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str = "02:00:00"
    port: int = 29500
    setup: str | None = None  # a shell line run first on the batch node, e.g. "source /path/venv/bin/activate"


def sbatch_script(recipe: Recipe, out: Path, rows: list[str], options: SlurmOptions, workdir: Path) -> str:
    directives = [
        f"--job-name=recompute-{recipe.name}",
        f"--nodes={recipe.nnodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={recipe.nproc_per_node}",
        "--exclusive",
        f"--time={options.time}",
        f"--output={out}/slurm-%j.out",
    ]
    if options.partition:
        directives.append(f"--partition={options.partition}")
    if options.account:
        directives.append(f"--account={options.account}")
    run = ["recompute-harness", "run", "--recipe", recipe.name, "--launcher", "slurm", "--out", str(out)]
    if tuple(rows) != recipe.rows:
        run += ["--rows", *rows]  # the [] control included: a control-only sweep still names a row
    command = " ".join(shlex.quote(part) for part in run) + f' --rdzv-endpoint "$HEAD:{options.port}"'
    lines = [
        "#!/bin/bash",
        f"# {recipe.description}",
        f"# Written by `recompute-harness launch --slurm --recipe {recipe.name}`; submit with `sbatch`.",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        f"cd {shlex.quote(str(workdir))}",
        *([options.setup] if options.setup else []),
        '# The c10d rendezvous store lives on the first node of the allocation.',
        'HEAD="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        command,
        "",
    ]
    return "\n".join(lines)
