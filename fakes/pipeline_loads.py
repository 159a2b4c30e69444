"""Whole pipelines to load at once (PIPE-1..4): components of a few MiB each, a class that
records every instance built (so a test can tell that nothing of a failed load stays alive),
and classes that fail at the end of their own load, while the other components still load.

Each failing class fails in `train(False)`, which every loader reaches once the component's
tensors are in: a loaded component is returned in eval mode (OUT-1). No loader needs to know
about these classes beyond the `models=` mapping a test hands it.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fakes.pipelines import (
    FakeComponent,
    PipelineDiT,
    PipelineVAE,
    write_component,
    write_pipeline,
)
from reference.request.model_index import MODEL_INDEX

__all__ = [
    "BIG_PIPELINE",
    "LATE",
    "FailingVAE",
    "InterruptedVAE",
    "TrackedConnectors",
    "TrackedDiT",
    "TrackedEncoder",
    "TrackedVAE",
    "Tracking",
    "alive",
    "built",
    "tracked_classes",
    "write_big_pipeline",
    "write_with_connectors",
]


class Tracking:
    """Every module built from a `Tracking` class, as weak references: a test asks which are
    still alive after a load (`alive`)."""

    _built: ClassVar[list[weakref.ref[nn.Module]]] = []
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def track(self) -> None:
        assert isinstance(self, nn.Module)
        with Tracking._lock:
            Tracking._built.append(weakref.ref(self))


def built() -> int:
    """How many tracked modules were built so far (a mark for `alive`)."""
    with Tracking._lock:
        return len(Tracking._built)


def alive(since: int = 0) -> list[str]:
    """The class names of the tracked modules still alive, of those built after the first
    `since` (`built()`)."""
    with Tracking._lock:
        return [type(m).__name__ for ref in Tracking._built[since:] if (m := ref()) is not None]


class TrackedDiT(PipelineDiT, Tracking):
    """The pipeline DiT, tracked."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.track()


class TrackedEncoder(PipelineDiT, Tracking):
    """A text encoder stand-in of the test's own library (the DiT's layers), tracked."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.track()


class TrackedVAE(PipelineVAE, Tracking):
    """The pipeline VAE, tracked."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.track()


class TrackedConnectors(nn.Module, Tracking):
    """A component of no named kind, of the test's own library: LTX-2 declares `connectors`
    (layers between its text encoder and its DiT) beside the DiT, VAEs, vocoder and text
    encoder. Plain torch layers, tracked."""

    def __init__(self, *, width: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.proj_in = nn.Linear(width, width)
        self.registers = nn.Parameter(torch.zeros(4, width))
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width)) for _ in range(depth)
        )
        self.track()


LATE = 0.5
"""Seconds a failing VAE's load takes after its tensors are in: the other components of its
pipeline load meanwhile, so the failure comes after they hold their memory."""


class FailingVAE(TrackedVAE):
    """A VAE whose load fails once its tensors are in, late (`LATE`): `train(False)` raises, as
    a model's own hook that breaks on its weights would."""

    def train(self, mode: bool = True) -> FailingVAE:
        if not mode:
            time.sleep(LATE)
            raise RuntimeError("FailingVAE: this component fails once its weights are loaded")
        super().train(mode)
        return self


class InterruptedVAE(TrackedVAE):
    """A VAE whose load is interrupted once its tensors are in, late (`LATE`), as by Ctrl-C."""

    def train(self, mode: bool = True) -> InterruptedVAE:
        if not mode:
            time.sleep(LATE)
            raise KeyboardInterrupt
        super().train(mode)
        return self


def tracked_classes() -> Mapping[str, type[nn.Module]]:
    """The classes these pipelines name, by class name (what a test hands as `models=`)."""
    return {
        cls.__name__: cls
        for cls in (
            TrackedDiT,
            TrackedEncoder,
            TrackedVAE,
            FailingVAE,
            InterruptedVAE,
            TrackedConnectors,
        )
    }


BIG_PIPELINE: Mapping[str, FakeComponent] = {
    # About 28 MiB each in fp32 (the DiT in two shards): what a load reads dwarfs the noise.
    "transformer": FakeComponent(
        TrackedDiT, {"hidden": 384, "depth": 6, "heads": 4}, shards=2, seed=2
    ),
    "text_encoder": FakeComponent(TrackedEncoder, {"hidden": 384, "depth": 6, "heads": 4}, seed=5),
    "vae": FakeComponent(TrackedVAE, {"hidden": 64, "groups": 8}, seed=3),
}
"""A DiT, a text encoder and a VAE, every tensor stored in fp32."""


def write_big_pipeline(
    root: Path, *, vae: type[nn.Module] = TrackedVAE, small: bool = False
) -> Path:
    """`BIG_PIPELINE` written into `root`, its VAE of class `vae` (a failing one, say), with a
    scheduler entry that holds no weights; `small`: the same classes a quarter as wide (what
    warms a process for a measured load of the big one)."""
    components = {}
    for name, component in BIG_PIPELINE.items():
        config = dict(component.config)
        if small:
            config["hidden"] //= 4
        cls = vae if name == "vae" else component.cls
        components[name] = FakeComponent(cls, config, shards=component.shards, seed=component.seed)
    return write_pipeline(
        root,
        components,
        extra_index={"scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]},
    )


def write_with_connectors(root: Path) -> Path:
    """The big pipeline a quarter as wide (`write_big_pipeline(small=True)`), and a
    `connectors` component of class `TrackedConnectors` with its config.json and weights, as
    LTX-2 declares one. Returns `root`."""
    write_big_pipeline(root, small=True)
    write_component(root, "connectors", FakeComponent(TrackedConnectors, {"width": 64}, seed=7))
    index = json.loads((root / MODEL_INDEX).read_text())
    index["connectors"] = ["fakes", TrackedConnectors.__name__]
    (root / MODEL_INDEX).write_text(json.dumps(index, indent=2))
    return root
