"""`python -m reference demo`: write a small pipeline, load it in each mode, print the tables.

The pipeline (a ~100 MiB DiT in two shards and a video VAE) goes into a temporary folder that is
removed afterwards (the demo says so), or into `--keep DIR`, which stays so that the printed
commands can be run again; with the [diffusers] extra a tiny real diffusers pipeline (Wan,
written by `WanPipeline.save_pretrained`) is loaded last, its text encoder with it. Each mode is
the `load` command with its flags, so the demo shows the real command line. Without CUDA the
runtime device is the CPU: direct VAE streaming then runs through the library call with a CPU
target (the flag itself needs CUDA, and the demo shows that refusal).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from reference.extras import install_hint
from reference.load.loaders import LoadedComponent
from reference.load.pipeline import load_pipeline
from reference.load.vae import load_vae
from reference.programs.cli import HEADER, MIB, Row, load_command
from reference.report.memory import PeakSampler
from reference.request.args import ServerArgs
from reference.request.platform import SYSTEM, Platform

__all__ = [
    "MODELS_FLAGS",
    "MODES",
    "demo",
    "demo_folder",
    "diffusers_pipeline",
    "quiet_hub_libraries",
    "stream_vae_on_cpu",
    "warm_up",
]

# The demo's classes are fakes: the command imports the module that registers them.
MODELS_FLAGS = ("--models", "fakes.pipelines", "--measure")
MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ordinary load, every component resident", ()),
    ("DiT CPU offload: checkpoint tensors adopted without a copy", ("--dit-cpu-offload",)),
    ("direct VAE streaming", ("--component-direct-gpu-weight-loading.vae",)),
    ("online FP8 with deferred CPU offload", ("--quantization", "fp8", "--dit-cpu-offload")),
    (
        "refused: direct DiT loading of an offloaded DiT",
        ("--direct-gpu-weight-loading", "--dit-cpu-offload"),
    ),
)


def stream_vae_on_cpu(root: Path) -> None:
    """The streaming path with a CPU target, as the library call (the flag needs CUDA)."""
    from fakes.pipelines import PipelineVAE

    config = {"hidden": 32, "groups": 8}
    with PeakSampler() as sampler:
        module, report = load_vae(
            lambda: PipelineVAE(**config),
            root / "vae",
            device=torch.device("cpu"),
            dtype=torch.float32,  # the VAE's precision (PREC-1)
        )
    print("$ python -c 'reference.load.vae.load_vae(..., device=cpu, dtype=torch.float32)'")
    print(HEADER)
    print(Row(LoadedComponent("vae", module, report), sampler.anon_growth).format())


def warm_up(folder: Path, device: torch.device) -> None:
    """Load a tiny pipeline once, so torch's one-time initialisation (about a second and tens of
    MiB on first use) is not charged to the first mode's figures."""
    from fakes.pipelines import MODEL_CLASSES, SMALL_PIPELINE, write_pipeline
    from reference.request.model_index import ModelRegistry

    with PeakSampler() as sampler:
        root = write_pipeline(folder, SMALL_PIPELINE)
        load_pipeline(
            root,
            ServerArgs(runtime_device=device),
            registry=ModelRegistry.of(MODEL_CLASSES),
        )
    print(f"warm-up load excluded from the tables ({sampler.anon_growth / MIB:.0f} MiB anon)")


@contextlib.contextmanager
def demo_folder(keep: Path | None) -> Iterator[Path]:
    """`keep` (created; left in place), else a temporary folder removed at the end, saying so."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        print(f"\nthe demo's folders stay in {keep} (--keep): the commands above run on them")
        return
    with tempfile.TemporaryDirectory(prefix="reference-demo-") as tmp:
        yield Path(tmp)
    print(f"\nremoved {tmp} and the pipelines in it; run with --keep DIR to keep them")


def demo(*, platform: Platform = SYSTEM, keep: Path | None = None) -> int:
    """Run the demo; returns 0 when every mode behaved as documented.

    Args:
        platform: CUDA facts.
        keep: write the pipelines into this folder and leave them there (else a temporary
            folder, removed at the end).
    """
    from fakes.pipelines import demo_pipeline, write_pipeline

    with demo_folder(keep) as folder:
        root = write_pipeline(folder / "pipeline", demo_pipeline())
        cuda = platform.cuda_available()
        print(f"demo pipeline written to {root} (runtime device: {'cuda:0' if cuda else 'cpu'})")
        warm_up(folder / "warm-up", torch.device("cuda", 0) if cuda else torch.device("cpu"))
        failures = 0
        for title, flags in MODES:
            print(f"\n## {title}")
            argv = [str(root), *MODELS_FLAGS, *flags]
            print(f"$ python -m reference load {shlex.join(argv)}")
            # The refusal goes to stdout, under its heading, however the streams are piped.
            code = load_command(argv, platform=platform, errors=sys.stdout)
            refused_on_purpose = title.startswith("refused")
            needs_cuda = "direct" in title and not cuda
            if needs_cuda and title == "direct VAE streaming":
                stream_vae_on_cpu(root)
            elif (code != 0) != (refused_on_purpose or needs_cuda):
                failures += 1
        failures += diffusers_pipeline(folder / "wan", platform=platform)
    return 1 if failures else 0


def quiet_hub_libraries() -> None:
    """diffusers and transformers print progress bars and warnings while they save."""
    import importlib

    for name in ("diffusers", "transformers"):
        logging = importlib.import_module(name).utils.logging
        logging.set_verbosity_error()
        logging.disable_progress_bar()


def diffusers_pipeline(root: Path, *, platform: Platform) -> int:
    """A real diffusers pipeline (written by `WanPipeline.save_pretrained`) loaded with the DiT
    and the text encoder CPU-offloaded (both adopted from their files); skipped, saying so,
    without the [diffusers] extra. Returns the failures."""
    import importlib.util

    print(
        "\n## a real diffusers pipeline (WanPipeline.save_pretrained): DiT and text encoder"
        " CPU offload"
    )
    libraries = ("diffusers", "transformers")
    missing = [name for name in libraries if importlib.util.find_spec(name) is None]
    if missing:
        print(f"skipped: {' and '.join(missing)} not installed; {install_hint('diffusers')}")
        return 0
    from fakes.diffusers_pipelines import WAN_PIPELINE, write_hub_pipeline

    quiet_hub_libraries()
    write_hub_pipeline(root, WAN_PIPELINE, sharded=True)
    argv = [str(root), "--dit-cpu-offload", "--component-cpu-offload.text_encoder", "--measure"]
    print(f"$ python -m reference load {shlex.join(argv)}")
    return int(load_command(argv, platform=platform, errors=sys.stdout) != 0)
