"""The sbatch script for a multi-node sweep: slurm allocates the nodes, the runner drives one
``srun`` step per row (one task per node, each a torchrun joined by a c10d rendezvous on the first
node), and writes the records exactly as on one host. The sweep directory must be on a filesystem
every node shares (the ranks' evidence is read from it).

With ``container_image`` every srun step runs in that image through pyxis/enroot (``srun
--container-image``, as NeMo-Run's Slurm executor does); the batch script itself stays outside, because a
containerised batch script cannot call srun. So the batch node's python never judges the image's
stack: the script's first srun step runs every pre-launch check (packages, labels, GPUs, Bridge's
validation) inside the image and writes the stack it saw (``run --preflight-only``); when it refuses,
the job fails there with its one line. The runner then launches with ``--preflighted`` and every
record's pins are the ranks' own, checked against that stack. The image's own python runs the ranks
and the preflight, so it needs the harness importable (installed with ``--no-deps``, or this checkout
mounted: the work directory and the sweep directory are mounted at the same paths). With ``golden_dir`` the script compares the sweep's
records with their golden after the run and exits non-zero when either failed."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.run.recipes import Recipe

SCRIPT_MARK = "# Written by `recompute-harness launch"  # how launch recognises a script it wrote
# What slurm accepts for a partition/account name and a time limit ("days-hours:minutes:seconds"
# forms, or "infinite"); anything else (a newline, `;`, `$(...)`) is refused, not put in a script.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._,-]*")
_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|infinite|unlimited|UNLIMITED")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str = "02:00:00"
    port: int = 29500
    setup: str | None = (
        None  # a shell line run first on the batch node, e.g. "source /path/venv/bin/activate"
    )
    container_image: str | None = None  # pyxis --container-image for every srun step
    container_mounts: tuple[
        str, ...
    ] = ()  # extra SRC:DST[:FLAGS] beyond the work and sweep directories
    golden_dir: Path | None = None  # compare the records with their golden after the run

    def validate(self) -> SlurmOptions:
        """Refuse (one line) any value that could change the script beyond the directive it names."""
        for option, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _NAME.fullmatch(value):
                raise UsageError(
                    f"{option} {value!r}: not a slurm name (letters, digits, '.', '_', '-', ',')"
                )
        if not _TIME.fullmatch(self.time):
            raise UsageError(
                f"--time {self.time!r}: expected a slurm time limit such as 02:00:00 or 1-12:00:00"
            )
        if not 1 <= self.port <= 65535:
            raise UsageError(f"--port must be in 1..65535, got {self.port}")
        if self.setup is not None and (
            "\n" in self.setup or "\r" in self.setup or "\0" in self.setup
        ):
            raise UsageError("--setup must be one shell line (no newline)")
        return self


def _refuse_unprintable(what: str, value: str) -> str:
    if any(ch in value for ch in "\n\r\0"):
        raise UsageError(f"{what} {value!r}: a newline cannot go into an sbatch script")
    return value


def container_srun_args(options: SlurmOptions, workdir: Path, out: Path) -> list[str]:
    """pyxis flags for each srun step; none without an image."""
    if not options.container_image:
        return []
    mounts = [f"{workdir}:{workdir}", f"{out}:{out}", *options.container_mounts]
    return [
        f"--container-image={options.container_image}",
        f"--container-mounts={','.join(mounts)}",
        f"--container-workdir={workdir}",
        "--no-container-mount-home",
    ]


def sbatch_script(
    recipe: Recipe,
    out: Path,
    rows: list[str],
    options: SlurmOptions,
    workdir: Path,
    recipe_source: str | None = None,
) -> str:
    """``recipe_source``: what ``--recipe`` was given (a recipe file's path), when not the packaged name."""
    options.validate()
    for what, value in (
        ("--out", str(out)),
        ("working directory", str(workdir)),
        *(("row", row) for row in rows),
        ("--container-image", options.container_image or ""),
        *(("--container-mounts", mount) for mount in options.container_mounts),
        ("--recipe", recipe_source or ""),
        ("--golden-dir", str(options.golden_dir or "")),
    ):
        _refuse_unprintable(what, value)
    # #SBATCH lines are not shell, but slurm splits them on blanks: a directory with a blank is refused.
    if any(ch.isspace() for ch in str(out)):
        raise UsageError(f"--out {str(out)!r}: slurm directives cannot hold a path with blanks")
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
    run = [
        "recompute-harness",
        "run",
        "--recipe",
        recipe_source or recipe.name,
        "--launcher",
        "slurm",
        "--out",
        str(out),
    ]
    if tuple(rows) != recipe.rows:
        run += ["--rows", *rows]  # the [] control included: a control-only sweep still names a row
    rendezvous = f' --rdzv-endpoint "$HEAD:{options.port}"'
    container = container_srun_args(options, workdir, out)
    preflight: list[str] = []
    if container:
        # Inside the image `recompute-harness` may not be on PATH (a mounted checkout): its python runs it.
        check = [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            *container,
            "python",
            "-m",
            "harness.cli",
            *run[1:],
        ]
        preflight = [
            "# Every pre-launch check runs inside the image, where the ranks will run; a refusal ends the job.",
            f'PREFLIGHT={shlex.quote(str(out))}/preflight-"$SLURM_JOB_ID".json',
            " ".join(shlex.quote(part) for part in check)
            + rendezvous
            + ' --preflight-only "$PREFLIGHT" || exit 2',  # its one line says why; nothing launched
        ]
        run += ["--preflighted", "$PREFLIGHT"]
    run += [f"--srun-arg={arg}" for arg in container]
    command = (
        " ".join('"$PREFLIGHT"' if part == "$PREFLIGHT" else shlex.quote(part) for part in run)
        + rendezvous
    )
    if options.golden_dir is not None:
        compare = ["recompute-harness", "compare", "--golden-dir", str(options.golden_dir)]
        command = "\n".join(
            [
                "status=0",
                f"{command} || status=$?",
                "# The sweep just written is the newest of this recipe under the sweep directory.",
                f'records="$(ls -1td {shlex.quote(str(out))}/{shlex.quote(recipe.name)}-*/records | head -n 1)"',
                " ".join(shlex.quote(part) for part in compare) + ' "$records" || status=$?',
                'exit "$status"',
            ]
        )
    lines = [
        "#!/bin/bash",
        f"# {recipe.description}",
        f"{SCRIPT_MARK} --slurm --recipe {recipe.name}`; submit with `sbatch`.",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        f"cd {shlex.quote(str(workdir))}",
        *([options.setup] if options.setup else []),
        "# The c10d rendezvous store lives on the first node of the allocation.",
        'HEAD="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        *preflight,
        command,
        "",
    ]
    return "\n".join(lines)
