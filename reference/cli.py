"""`python -m reference load PIPELINE_DIR [flags]`: admit, load every component, print a table.

Exit codes: 0 loaded; 2 refused or failed: one line `error: ...` on stderr naming the flag,
component, tensor or file, and what to do; never a traceback, whatever failed.

Model classes: a component whose model_index.json entry names the `diffusers` library is built
from diffusers' own class; any other class must be registered by a module that `--models MODULE`
imports (none by default).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TextIO

from reference.args import (
    COMPONENT_DIRECT_FLAG,
    COMPONENT_OFFLOAD_FLAG,
    DEVICE_FLAG,
    DIRECT_FLAG,
    DIT_OFFLOAD_FLAG,
    FSDP_FLAG,
    LAYERWISE_FLAG,
    QUANTIZATION_FLAG,
    TP_FLAG,
    ServerArgs,
    known_flags,
    parse_args,
)
from reference.checkpoint import reading_progress
from reference.errors import ArgumentError, LoadError
from reference.extras import install_hint
from reference.load import iter_load, not_loaded
from reference.loaders import LoadedComponent
from reference.memory import PeakSampler
from reference.pipeline import MODELS, ModelRegistry, read_pipeline
from reference.platform import SYSTEM, Platform

MIB = 1024 * 1024
LOADING_FLAGS: tuple[tuple[str, str], ...] = (
    (
        f"{DEVICE_FLAG} DEVICE",
        "runtime device: cpu, cuda or cuda:N (default: cuda:0 if present, else cpu)",
    ),
    (f"{DIT_OFFLOAD_FLAG} [true|false]", "CPU-offload every DiT component (zero-copy adoption)"),
    (f"{LAYERWISE_FLAG} [true|false]", "layerwise offload of the DiT"),
    (
        f"{COMPONENT_OFFLOAD_FLAG}.COMPONENT[=true|false]",
        "CPU-offload one component (vae, text_encoder, ...)",
    ),
    (f"{DIRECT_FLAG} [true|false]", "load every DiT component straight onto the GPU (CUDA only)"),
    (
        f"{COMPONENT_DIRECT_FLAG}.COMPONENT[=true|false]",
        "load one component straight onto the GPU: vae, video_vae (CUDA only)",
    ),
    (f"{FSDP_FLAG} [true|false]", "FSDP inference (the DiT is sharded by FSDP)"),
    (f"{TP_FLAG} N", "tensor-parallel size (default 1)"),
    (f"{QUANTIZATION_FLAG} METHOD", "quantize the DiT online, e.g. fp8 (classes built for it)"),
    (
        f"{QUANTIZATION_FLAG}-serialized [true|false]",
        "the checkpoint is already stored in that format",
    ),
)
"""Every loading flag reference.args parses, for `load --help`."""
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
    registry: ModelRegistry = MODELS,
    platform: Platform = SYSTEM,
) -> list[Row]:
    """Load the pipeline, measuring each component's peak anonymous memory growth.

    Raises:
        LoadError: any refusal or failure (see reference.load.load_pipeline).
    """
    rows: list[Row] = []
    components = iter_load(root, args, registry=registry, platform=platform)
    with progress_bar() as update, reading_progress(update):
        while True:
            with PeakSampler() as sampler:
                loaded = next(components, None)
            if loaded is None:
                return rows
            rows.append(Row(loaded, sampler.anon_growth))


def did_you_mean(token: str, known: Sequence[str]) -> str | None:
    """The known flag nearest to a misspelled `token` (`--dit-cpu-ofload`), or None.

    A per-component flag is matched by its prefix and keeps its component
    (`--component-cpu-ofload.vae` -> `--component-cpu-offload.vae`).
    """
    key = token.split("=", 1)[0]
    prefix, dot, component = key.partition(".")
    candidates = [flag for flag in known if ("." in flag) == bool(dot)]
    match = difflib.get_close_matches(prefix + dot, candidates, n=1, cutoff=0.75)
    if not match:
        return None
    return match[0] + component if dot else match[0]


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one `error:` line like every other refusal, and that
    names the nearest flag for a misspelled one."""

    def error(self, message: str) -> NoReturn:
        _, sep, tail = message.partition("unrecognized arguments: ")
        if sep:
            known = [*known_flags(), *self._option_string_actions]
            hints = [
                f"{token}: did you mean {near}?"
                for token in tail.split()
                if token.startswith("--") and (near := did_you_mean(token, known)) is not None
            ]
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        raise ArgumentError(f"{message}; see python -m reference load --help")


def _parser() -> argparse.ArgumentParser:
    flags = "\n".join(
        f"  {flag:<40} {what}" if len(flag) <= 40 else f"  {flag}\n  {'':<40} {what}"
        for flag, what in LOADING_FLAGS
    )
    parser = _Parser(
        prog="python -m reference load",
        description="Load every component of a pipeline folder and print what each load did.",
        epilog=(
            f"loading options:\n{flags}\n\nA component whose model_index.json entry names the"
            ' diffusers library\n(e.g. ["diffusers", "WanTransformer3DModel"]) is built from'
            f" diffusers' own class\n({install_hint('diffusers')});"
            " other classes need --models.\nSchedulers, tokenizers and text encoders are listed"
            " as not loaded; the pipeline's own settings in model_index.json are listed too."
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
        help="import MODULE first, so that it registers your model classes with"
        " reference.pipeline.MODELS.register (repeatable; default: none)",
    )
    return parser


def import_models(modules: Sequence[str]) -> None:
    """Import each `--models` module (they register model classes when imported).

    Raises:
        ArgumentError: a module that cannot be imported, naming it.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ArgumentError(
                f"--models {module}: cannot import it ({exc}); give an importable module that"
                " registers model classes"
            ) from None


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line; a failure no loader named says what it was."""
    text = " ".join(str(exc).split())
    if isinstance(exc, (LoadError, ValueError)):
        return text
    return f"unexpected {type(exc).__name__} while loading: {text}"


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
        import_models(options.models)
        pipeline = read_pipeline(options.pipeline)
        rows = load_with_table(options.pipeline, args, platform=platform)
    except Exception as exc:  # every failure is one line and exit 2, never a traceback
        sys.stdout.flush()
        stream = errors or sys.stderr
        print(f"error: {one_line(exc)}", file=stream)
        stream.flush()
        return 2
    try:
        print(HEADER)
        for row in rows:
            print(row.format())
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
