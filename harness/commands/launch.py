"""``recompute-harness launch --slurm --recipe NAME [...]``: write the sbatch script for a multi-node sweep.

The script runs ``recompute-harness run --launcher slurm`` on the batch node: one ``srun`` step per
row, torchrun on every node, c10d rendezvous on the first node. Nothing is submitted: the script is
written (atomically) and its path printed; submit it with ``sbatch``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.options import add_golden_dir
from harness.errors import EXIT_OK, UsageError
from harness.files import check_output, write_text_atomic
from harness.run.recipes import is_recipe_file, load_recipe
from harness.run.runner import sweep_rows
from harness.run.slurm import SCRIPT_MARK, SlurmOptions, sbatch_script


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slurm",
        action="store_true",
        required=True,
        help="write an sbatch script (the only engine)",
    )
    parser.add_argument(
        "--recipe",
        required=True,
        help="recipe name (see `run --list`), or the path of a recipe .toml file",
    )
    parser.add_argument(
        "--rows", nargs="+", metavar="ROW", help="rows instead of the recipe's ([] always first)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs"), help="sweep directory on a shared filesystem"
    )
    parser.add_argument(
        "--script", type=Path, help="where to write the script (default: OUT/<recipe>.sbatch)"
    )
    parser.add_argument("--partition")
    parser.add_argument("--account")
    parser.add_argument("--time", default="02:00:00", help="slurm time limit (default 02:00:00)")
    parser.add_argument(
        "--port", type=int, default=29500, help="c10d rendezvous port on the first node"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace --script's file even if launch did not write it",
    )
    parser.add_argument(
        "--setup", help="shell line run first, e.g. 'source /shared/venv/bin/activate'"
    )
    parser.add_argument(
        "--container-image",
        metavar="IMAGE",
        help="run every srun step in this image through pyxis/enroot (e.g. nvcr.io#nvidia/nemo:25.09)",
    )
    parser.add_argument(
        "--container-mounts",
        metavar="SRC:DST[,...]",
        help="extra pyxis mounts (the work and sweep directories are always mounted)",
    )
    add_golden_dir(
        parser,
        "after the run, compare the records with their golden under DIR (exit non-zero on a failure)",
    )


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    if recipe.device != "cuda":
        raise UsageError(
            f"recipe {recipe.name!r} runs on {recipe.device}: slurm launch is for GPU recipes"
        )
    rows = sweep_rows(recipe, args.rows)
    out = args.out.resolve()
    script = args.script or out / f"{recipe.name}.sbatch"
    if args.container_mounts is not None and not args.container_image:
        raise UsageError("--container-mounts needs --container-image")
    mounts = tuple(m for m in (args.container_mounts or "").split(",") if m)
    options = SlurmOptions(
        args.partition,
        args.account,
        args.time,
        args.port,
        args.setup,
        args.container_image,
        mounts,
        args.golden_dir.resolve() if args.golden_dir is not None else None,
    )
    source = str(Path(args.recipe).resolve()) if is_recipe_file(args.recipe) else None
    text = sbatch_script(recipe, out, rows, options, workdir=Path.cwd(), recipe_source=source)
    check_output(script, args.force, lambda head: SCRIPT_MARK.encode() in head, "sbatch script")
    write_text_atomic(script, text, mode=0o755)
    print(script)
    return EXIT_OK
