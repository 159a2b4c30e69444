"""`python -m reference load PIPELINE_DIR [flags]`: admit, load every component, print a table.

Exit codes: 0 loaded; 2 refused (any `LoadError`, a failure inside a component's load included):
one line `error: ...` on stderr naming the flag, component, tensor or file, and what to do;
3 an internal error (a bug, not a refusal): one line saying so, and the traceback with `--debug`.

Model classes: a component whose model_index.json entry names the `diffusers` library is built
from diffusers' own class; any other class must be registered by a module that `--models MODULE`
imports (none by default).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reference.errors import ArgumentError, LoadError, shown
from reference.extras import install_hint
from reference.load.loaders import LoadedComponent
from reference.load.pipeline import iter_load, load_pipeline, not_loaded
from reference.read.checkpoint import reading_progress
from reference.report.memory import STATUS, PeakSampler, can_measure
from reference.request.args import (
    FLAGS,
    PROG,
    Parser,
    ServerArgs,
    parse_args,
)
from reference.request.model_index import MODEL_CLASSES, ModelRegistry, read_pipeline
from reference.request.platform import SYSTEM, Platform
from reference.request.precision import precision_name

__all__ = [
    "DEBUG_FLAG",
    "EXIT_INTERNAL",
    "EXIT_REFUSED",
    "HEADER",
    "MEASURE_FLAG",
    "MIB",
    "Row",
    "import_models",
    "load_command",
    "load_with_table",
    "one_line",
    "progress_bar",
]

MIB = 1024 * 1024
HEADER = (
    f"{'component':<14} {'dtype':<5} {'load':<7} {'post':<7} {'defer':<5} {'direct':<6}"
    f" {'adopted MiB':>11} {'copied MiB':>10} {'streamed MiB':>12} {'time s':>7}"
    f" {'peak anon MiB':>13}"
)


@dataclass(frozen=True)
class Row:
    """One component's line of the table; `peak_anon_bytes` is None unless measured."""

    loaded: LoadedComponent
    peak_anon_bytes: int | None

    def format(self) -> str:
        report = self.loaded.report
        peak = "-" if self.peak_anon_bytes is None else f"{self.peak_anon_bytes / MIB:.1f}"
        plan = report.plan
        post = str(plan.weight_postprocess_device or "-")
        dtype = "-" if report.precision is None else precision_name(report.precision)
        return (
            f"{report.component:<14} {dtype:<5} {plan.checkpoint_load_device!s:<7} {post:<7} "
            f"{'yes' if plan.defer_cpu_offload else 'no':<5} "
            f"{'yes' if plan.load_full_state_dict_on_device else 'no':<6} "
            f"{report.adopted.bytes / MIB:>11.1f} {report.copied.bytes / MIB:>10.1f} "
            f"{report.streamed.bytes / MIB:>12.1f} {report.seconds:>7.2f} "
            f"{peak:>13}"
        )


@contextmanager
def progress_bar() -> Iterator[Callable[[int], object]]:
    """A byte counter drawn by tqdm on a terminal, once a load has taken more than two seconds.

    tqdm serves this bar only, so it is imported here; without it the load runs without a bar.
    """
    try:
        from tqdm import tqdm
    except ImportError:
        yield lambda n: None
        return
    terminal = sys.stderr.isatty()
    with tqdm(
        desc="reading tensors",
        unit="B",
        unit_scale=True,
        delay=2.0,
        leave=False,
        disable=not terminal,
    ) as bar:
        yield bar.update


def load_with_table(
    root: Path,
    args: ServerArgs,
    *,
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
    measure: bool = False,
) -> list[Row]:
    """Load the pipeline whole (`reference.load.pipeline.load_pipeline`: every refusal first,
    then the components at once, one progress bar for all their bytes); with `measure`, one
    component after another instead (`iter_load`, the same preflight), sampling each
    component's peak anonymous memory growth (a thread reading /proc/self/status while it
    loads: only when asked, since it competes with the load it measures, and concurrent loads
    would share one figure).

    Raises:
        LoadError: any refusal or failure (see reference.load.pipeline.load_pipeline).
    """
    with progress_bar() as update, reading_progress(update):
        if not measure:
            loaded = load_pipeline(root, args, registry=registry, platform=platform)
            return [Row(item, None) for item in loaded]
        rows: list[Row] = []
        components = iter_load(root, args, registry=registry, platform=platform)
        while True:
            with PeakSampler() as sampler:
                item = next(components, None)
            if item is None:
                return rows
            rows.append(Row(item, sampler.anon_growth))


def _parser() -> argparse.ArgumentParser:
    flags = "\n".join(
        f"  {f.usage:<40} {f.help}" if len(f.usage) <= 40 else f"  {f.usage}\n  {'':<40} {f.help}"
        for f in FLAGS
    )
    parser = Parser(
        prog=PROG,
        description="Load every component of a pipeline folder and print what each load did.",
        epilog=(
            f"loading options:\n{flags}\n\nA component whose model_index.json entry names the"
            ' diffusers library\n(["diffusers", "WanTransformer3DModel"]) or one of its pipeline'
            ' packages (["ltx2", "LTX2TextConnectors"])\nis built from diffusers\' own class'
            f" ({install_hint('diffusers')});\none named"
            ' ["transformers", "<Class>"] from the class transformers ships; other classes need'
            " --models.\nEvery component whose folder holds a config.json or weights is loaded,"
            " whatever its name;\nschedulers, tokenizers and processors are listed as not"
            " loaded, and the pipeline's own settings\nin model_index.json are listed too."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("pipeline", type=Path, help="pipeline folder with model_index.json")
    parser.add_argument(
        "--models",
        action="append",
        metavar="MODULE",
        default=[],
        help=f"import MODULE first and use the model classes of its {MODEL_CLASSES} mapping"
        " (class name -> class; repeatable; default: none)",
    )
    parser.add_argument(
        MEASURE_FLAG,
        action="store_true",
        help="fill the peak anon MiB column: sample each load's anonymous memory (Linux only)",
    )
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help="on an internal error (exit 3, a bug rather than a refusal), print its traceback",
    )
    return parser


def import_models(modules: Sequence[str]) -> ModelRegistry:
    """The registry of the `--models` modules: each is imported and its `MODEL_CLASSES` (class
    name -> class) registered, in order. Nothing is registered by importing alone.

    Raises:
        ArgumentError: a module that cannot be imported, that defines no `MODEL_CLASSES`
            mapping, or two modules giving one name to two classes, naming the module.
    """
    registry = ModelRegistry()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ArgumentError(
                f"--models {name}: cannot import it ({exc}); give an importable module that"
                f" defines {MODEL_CLASSES}"
            ) from None
        classes = getattr(module, MODEL_CLASSES, None)
        if not isinstance(classes, Mapping):
            raise ArgumentError(
                f"--models {name}: the module defines no {MODEL_CLASSES} mapping; add"
                f' {MODEL_CLASSES} = {{"MyDiT": MyDiT}} naming each class model_index.json uses'
            )
        try:
            for class_name, cls in classes.items():
                registry.register(cls, name=class_name)
        except ArgumentError as exc:
            raise ArgumentError(f"--models {name}: {exc}") from None
    return registry


EXIT_REFUSED = 2
EXIT_INTERNAL = 3
DEBUG_FLAG = "--debug"
MEASURE_FLAG = "--measure"


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line: a refusal's own words, or an internal error said so."""
    text = shown(" ".join(str(exc).split()) or "(no message)")
    if isinstance(exc, LoadError):
        return text
    return (
        f"internal error: {type(exc).__name__}: {text}. This is a bug, not a refusal of the"
        f" input; rerun with {DEBUG_FLAG} for the traceback and report it"
    )


def load_command(
    argv: Sequence[str], *, platform: Platform = SYSTEM, errors: TextIO | None = None
) -> int:
    """Run `load`; returns the exit code.

    Args:
        argv: the arguments after `load`.
        platform: CUDA facts.
        errors: where the `error:` line goes (default: stderr; the demo keeps it beside its
            headings on stdout).
    """
    try:
        args, rest = parse_args(argv)
        options = _parser().parse_args(rest)
        registry = import_models(options.models)
        if options.measure and not can_measure():
            raise ArgumentError(
                f"{MEASURE_FLAG}: this system has no {STATUS} to sample memory from; drop the flag"
            )
        pipeline = read_pipeline(options.pipeline)
        rows = load_with_table(
            options.pipeline, args, registry=registry, platform=platform, measure=options.measure
        )
    except Exception as exc:  # every failure is one line; a traceback only when asked
        sys.stdout.flush()
        stream = errors or sys.stderr
        internal = not isinstance(exc, LoadError)
        if internal and DEBUG_FLAG in argv:
            traceback.print_exception(exc, file=stream)
        print(f"error: {one_line(exc)}", file=stream)
        stream.flush()
        return EXIT_INTERNAL if internal else EXIT_REFUSED
    try:
        print(HEADER)
        for row in rows:
            print(row.format())
        converted = [
            f"{row.loaded.name:<14} {precision_name(source)} -> {precision_name(target)}:"
            f" {tally.tensors} tensors, {tally.bytes / MIB:.1f} MiB"
            for row in rows
            for (source, target), tally in row.loaded.report.conversions.items()
        ]
        if converted:
            print("\nconverted (checkpoint dtype -> component dtype, once per tensor):")
            for line in converted:
                print(line)
        notes = [(row.loaded.name, note) for row in rows for note in row.loaded.report.notes]
        if notes:
            print("\nnotes:")
            for name, note in notes:
                print(f"{name:<14} {note}")
        skipped = not_loaded(pipeline)
        if skipped:
            print("\nnot loaded:")
            for name, why in skipped:
                print(f"{name:<14} {why}")
        if pipeline.settings:
            print("\npipeline settings (model_index.json):")
            for key, value in pipeline.settings.items():
                print(f"{key:<14} {json.dumps(value)}")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (`| head`) left: the load itself succeeded
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
