"""One record per tensor placed: how it reached its slot, and why it was not adopted (ZC-14).

The placing step writes these; the report (`reference.report.summary.LoadReport`) sums them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# adopted: the checkpoint tensor became the parameter's storage (no copy)
# copied: a fresh tensor was filled by the layer's weight_loader (or a plain copy)
# streamed: read on its own and assigned into its slot (direct VAE loading)
How = Literal["adopted", "copied", "streamed"]

__all__ = ["How", "TensorRecord"]


@dataclass(frozen=True)
class TensorRecord:
    """One checkpoint tensor's fate.

    Attributes:
        name: the parameter or buffer name.
        how: adopted, copied or streamed.
        nbytes: bytes of the resulting tensor.
        reason: for a copy, the first failing zero-copy condition (e.g. "ZC-5: tp_size is 2").
        converted_from: the checkpoint's dtype where it differed from the slot's, so the tensor
            was converted once into the slot's dtype (PREC-4); None where it kept its dtype.
        dtype: the dtype of the resulting tensor (None where the loader does not say).
    """

    name: str
    how: How
    nbytes: int
    reason: str | None = None
    converted_from: torch.dtype | None = None
    dtype: torch.dtype | None = None
