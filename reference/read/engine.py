"""The copy-engine seam: the only device-specific acts of a staging reader.

A reader that stages tensors for a device needs three things from it: a host staging buffer,
an asynchronous copy of part of that buffer into a device tensor (on one of `streams` streams)
that returns an event, and that event's completion (`CopyEvent.wait` re-raises the error of a
copy that failed). `reference.read.staging.StagingReader` asks nothing else of the device, so the
same reader runs on CUDA (`CudaEngine`), on the CPU (`CpuEngine`), and on a CPU engine that
completes copies late, out of order, or fails them (the kit's `fakes.engine.DelayedEngine`),
which shows on a CPU every ordering bug a real GPU shows only as rare corrupted weights.

Contract of every engine:
  * `staging(nbytes)` returns a fresh contiguous uint8 CPU tensor of exactly `nbytes`; the
    caller gives it back with `release` once no copy from it is pending, and not before.
  * `copy(source, destination, stream=k)` starts copying the uint8 tensor `source` (host) into
    the uint8 tensor `destination` (same number of bytes); the source may be read at any time
    until the returned event completes, so the caller must not refill it before then.
  * `stages_in_place(device)`: the staging buffer may be the destination itself (host memory
    onto the CPU): the reader then reads straight into the destination and copies nothing.
"""

from __future__ import annotations

import mmap
from typing import Protocol

import torch

from reference.errors import ArgumentError

__all__ = [
    "COMPLETED",
    "CompletedCopy",
    "CopyEngine",
    "CopyEvent",
    "CpuEngine",
    "CudaEngine",
    "engine_for",
]


class CopyEvent(Protocol):
    """One asynchronous copy."""

    def query(self) -> bool:
        """Whether the copy has finished (done or failed); never blocks."""
        ...

    def wait(self) -> None:
        """Block until the copy has finished; re-raise its error if it failed."""
        ...


class CopyEngine(Protocol):
    """Staging buffers and asynchronous host-to-device copies (see the module's contract)."""

    @property
    def streams(self) -> int:
        """How many copy streams `copy` accepts (0 .. streams - 1)."""
        ...

    def stages_in_place(self, device: torch.device) -> bool:
        """Whether a destination on `device` may serve as its own staging buffer."""
        ...

    def staging(self, nbytes: int) -> torch.Tensor:
        """A host staging buffer: a contiguous uint8 CPU tensor of exactly `nbytes`."""
        ...

    def release(self, buffer: torch.Tensor) -> None:
        """Give back a buffer `staging` returned; no copy from it may still be pending."""
        ...

    def copy(self, source: torch.Tensor, destination: torch.Tensor, *, stream: int) -> CopyEvent:
        """Start copying `source` (host, uint8) into `destination` (uint8, same size)."""
        ...


class CompletedCopy:
    """The event of a copy that has already finished (or failed with `error`)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def query(self) -> bool:
        return True

    def wait(self) -> None:
        if self.error is not None:
            raise self.error


COMPLETED = CompletedCopy()


class CpuEngine:
    """Copies on the caller's thread, synchronously: the event is complete when `copy` returns.

    Onto the CPU the destination is host memory, so by default (`in_place`) it is its own
    staging buffer: the reader reads the file straight into it and nothing is copied. With
    `in_place=False` every byte goes through a staging buffer (the path a device takes)."""

    def __init__(self, *, in_place: bool = True) -> None:
        self.in_place = in_place

    @property
    def streams(self) -> int:
        return 1

    def stages_in_place(self, device: torch.device) -> bool:
        return self.in_place and device.type == "cpu"

    def staging(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def release(self, buffer: torch.Tensor) -> None:
        del buffer  # an ordinary allocation: dropped with its last reference

    def copy(self, source: torch.Tensor, destination: torch.Tensor, *, stream: int) -> CopyEvent:
        destination.copy_(source)
        return COMPLETED


class _CudaCopy:
    def __init__(self, event: torch.cuda.Event) -> None:  # pragma: no cover - CUDA only
        self.event = event

    def query(self) -> bool:  # pragma: no cover - CUDA only
        return bool(self.event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> None:  # pragma: no cover - CUDA only
        self.event.synchronize()


class CudaEngine:
    """CUDA streams and events, copies with `non_blocking=True` from pinned staging buffers.

    Staging is pinned at its exact size: torch's caching host allocator rounds a pinned block up
    to a power of two (a 96 MiB buffer would pin 128 MiB), so each buffer is an anonymous
    page-aligned map of its own, registered with `cudaHostRegister` and unregistered on release.
    Each copy first waits for the work already queued on the current stream, which may still use
    the memory the destination's allocation reused. Constructed only where CUDA is present.

    Raises:
        ArgumentError: `device` is not a CUDA device, or CUDA is not available.
    """

    def __init__(self, device: torch.device, *, streams: int = 2) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ArgumentError(f"CudaEngine needs an available CUDA device, not {device}")
        self.device = device  # pragma: no cover - CUDA only
        self._streams = [  # pragma: no cover - CUDA only
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            for _ in range(streams)
        ]
        self._maps: dict[int, mmap.mmap] = {}  # pragma: no cover - CUDA only

    @property
    def streams(self) -> int:  # pragma: no cover - CUDA only
        return len(self._streams)

    def stages_in_place(self, device: torch.device) -> bool:  # pragma: no cover - CUDA only
        return False

    def staging(self, nbytes: int) -> torch.Tensor:  # pragma: no cover - CUDA only
        # Private, so the pinned pages count as this process's own memory (not shared memory).
        area = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buffer = torch.frombuffer(area, dtype=torch.uint8, count=nbytes)
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        code = int(cudart.cudaHostRegister(buffer.data_ptr(), max(nbytes, 1), 0))
        if code != 0:
            raise RuntimeError(
                f"pinning a {nbytes}-byte staging buffer failed (cudaError {code}); give"
                " ReadOptions a smaller staging_bytes or staging_buffers"
            )
        self._maps[buffer.data_ptr()] = area
        return buffer

    def release(self, buffer: torch.Tensor) -> None:  # pragma: no cover - CUDA only
        pointer = buffer.data_ptr()
        if self._maps.pop(pointer, None) is not None:
            torch.cuda.cudart().cudaHostUnregister(pointer)  # type: ignore[no-untyped-call]

    def copy(  # pragma: no cover - CUDA only
        self, source: torch.Tensor, destination: torch.Tensor, *, stream: int
    ) -> CopyEvent:
        side = self._streams[stream % len(self._streams)]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            destination.copy_(source, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
        return _CudaCopy(event)


def engine_for(device: torch.device) -> CopyEngine:
    """The engine for loads onto `device`: `CpuEngine` for the CPU, `CudaEngine` for CUDA.

    Raises:
        ArgumentError: naming the device, for any other device type (pass an engine instead).
    """
    if device.type == "cpu":
        return CpuEngine()
    if device.type == "cuda":
        return CudaEngine(device)  # pragma: no cover - CUDA only
    raise ArgumentError(
        f"no copy engine for device {device}: staging reads onto cpu or cuda; pass an engine"
        " in the load's steps for another device"
    )
