"""`python -m reference load PIPELINE_DIR [flags]`: admit, load every component, print a table.

Exit codes: 0 loaded; 2 refused or failed (one line on stderr naming the flag, component, tensor
or file, and what to do).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from reference.args import DEVICE_FLAG, ServerArgs, parse_args
from reference.checkpoint import reading_progress
from reference.errors import LoadError
from reference.load import iter_load
from reference.loaders import LoadedComponent
from reference.memory import PeakSampler
from reference.pipeline import MODELS, ModelRegistry
from reference.platform import SYSTEM, Platform

MIB = 1024 * 1024
DEFAULT_MODELS = "fakes.pipelines"
HEADER = (
    f"{'component':<14} {'load':<7} {'post':<7} {'defer':<5} {'direct':<6} {'adopted MiB':>11} "
    f"{'copied MiB':>10} {'streamed MiB':>12} {'time s':>7} {'peak anon MiB':>13}"
)


@dataclass(frozen=True)
class Row:
    """One component's line of the table."""

    loaded: LoadedComponent
    peak_anon_bytes: int

    def format(self) -> str:
        report = self.loaded.report
        plan = report.plan
        post = str(plan.weight_postprocess_device or "-")
        return (
            f"{report.component:<14} {plan.checkpoint_load_device!s:<7} {post:<7} "
            f"{'yes' if plan.defer_cpu_offload else 'no':<5} "
            f"{'yes' if plan.load_full_state_dict_on_device else 'no':<6} "
            f"{report.adopted[1] / MIB:>11.1f} {report.copied[1] / MIB:>10.1f} "
            f"{report.streamed[1] / MIB:>12.1f} {report.seconds:>7.2f} "
            f"{self.peak_anon_bytes / MIB:>13.1f}"
        )


def load_with_table(
    root: Path,
    args: ServerArgs,
    *,
    registry: ModelRegistry = MODELS,
    platform: Platform = SYSTEM,
) -> list[Row]:
    """Load the pipeline, measuring each component's peak anonymous memory growth.

    Raises:
        LoadError: any refusal or failure (see reference.load.load_pipeline).
    """
    rows: list[Row] = []
    components = iter_load(root, args, registry=registry, platform=platform)
    # The bar shows only on a terminal, and only once a load has taken more than two seconds.
    bar = tqdm(
        desc="reading tensors",
        unit="B",
        unit_scale=True,
        delay=2.0,
        leave=False,
        disable=not sys.stderr.isatty(),
    )
    with bar, reading_progress(bar.update):
        while True:
            with PeakSampler() as sampler:
                loaded = next(components, None)
            if loaded is None:
                return rows
            rows.append(Row(loaded, sampler.anon_growth))


def default_device_flag(platform: Platform) -> list[str]:
    """`--device` for this machine, placed first so an explicit `--device` wins."""
    return [DEVICE_FLAG, "cuda:0" if platform.cuda_available() else "cpu"]


def load_command(argv: Sequence[str], *, platform: Platform = SYSTEM) -> int:
    """Run `load`; returns the exit code."""
    try:
        args, rest = parse_args([*default_device_flag(platform), *argv])
        parser = argparse.ArgumentParser(prog="python -m reference load")
        parser.add_argument("pipeline", type=Path, help="pipeline folder with model_index.json")
        parser.add_argument(
            "--models",
            action="append",
            metavar="MODULE",
            help="import MODULE to register model classes (default: fakes.pipelines)",
        )
        options = parser.parse_args(rest)
        for module in options.models or [DEFAULT_MODELS]:
            importlib.import_module(module)
        rows = load_with_table(options.pipeline, args, platform=platform)
    except (LoadError, ValueError) as exc:
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr)
        sys.stderr.flush()
        return 2
    print(HEADER)
    for row in rows:
        print(row.format())
    return 0
