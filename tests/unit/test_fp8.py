"""FP8: online quantization and deferred CPU offload."""

from __future__ import annotations

import pytest

from reference.adapter import PLANS, LoaderAdapter
from reference.quantization import QuantizationSpec


@pytest.mark.rule("FP8-1")
@pytest.mark.capability(PLANS)
@pytest.mark.parametrize(
    ("quantization", "expected"),
    [
        (QuantizationSpec("fp8"), True),
        (QuantizationSpec("FP8"), True),
        (QuantizationSpec("mxfp4"), True),
        (QuantizationSpec("fp8", serialized=True), False),
        (QuantizationSpec("mxfp4", serialized=True), False),
        (QuantizationSpec("modelopt_fp8", serialized=True), False),
        (QuantizationSpec("gguf"), False),
        (QuantizationSpec("awq"), False),
        (None, False),
    ],
    ids=str,
)
def test_requires_device_weight_processing(
    loader: LoaderAdapter, quantization: QuantizationSpec | None, expected: bool
) -> None:
    assert loader.requires_device_weight_processing(quantization) is expected


@pytest.mark.rule("FP8-1")
def test_quantization_spec_needs_a_method() -> None:
    with pytest.raises(ValueError, match="method"):
        QuantizationSpec("")
