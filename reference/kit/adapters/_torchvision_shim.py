"""Let `import torchvision` succeed where its compiled extension cannot load.

sglang imports transformers, which imports torchvision. The torchvision wheel that matches a
CPU-only torch 2.13 (0.28.0) is a CUDA build: its `_C` extension links CUDA libraries the CPU
torch lacks, so torchvision marks its operators as missing, and then its meta registrations call
`torch.library.register_fake` for `torchvision::nms` and `torchvision::qnms` without checking,
which raises "operator torchvision::nms does not exist" at import time.

`install()` runs before torchvision is first imported. When the extension loads it changes
nothing; otherwise it declares those two operator schemas (as torchvision's C++ declares them)
and no kernel, so the import succeeds while `torchvision.ops.nms` still fails loudly.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

__all__ = ["SCHEMAS", "install"]

SCHEMAS = {
    "torchvision::nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "torchvision::qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_outcome: dict[str, str] = {}  # the one outcome, once install() has run


def _operator_exists(qualname: str) -> bool:
    namespace, name = qualname.split("::")
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _load_extension() -> bool:
    """Load torchvision's `_C` without importing the package; whether it loaded."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    for location in spec.submodule_search_locations:
        for name in os.listdir(location):
            if name.startswith("_C") and name.endswith((".so", ".pyd")):
                try:
                    torch.ops.load_library(os.path.join(location, name))  # type: ignore[no-untyped-call]
                except (OSError, RuntimeError):
                    return False
                return True
    return False


def install() -> str:
    """Idempotent. Returns "not-needed" (torchvision absent or already imported),
    "real-extension" (its extension loaded) or "schemas-defined" (the schemas were declared)."""
    if "outcome" in _outcome:
        return _outcome["outcome"]
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        outcome = "not-needed"
    elif _load_extension():
        outcome = "real-extension"
    else:
        for qualname, schema in SCHEMAS.items():
            if not _operator_exists(qualname):
                torch.library.define(qualname, schema)
        outcome = "schemas-defined"
    _outcome["outcome"] = outcome
    return outcome
