"""diffusers' own loading behind the seam: a real third-party loader in the conformance matrix.

`DiffusersLoader` runs diffusers' `ModelMixin.from_pretrained` loading steps on the suite's
inputs, in from_pretrained's order, each step one of diffusers' own functions, with the arguments
from_pretrained passes by default when accelerate is installed (`low_cpu_mem_usage=True`, the
meta-device path) and `device_map={"": device}` (diffusers' way to load straight onto a device):

    quantization   DiffusersAutoQuantizer.from_config(config["quantization_config"] or request)
    files          utils.hub_utils._get_checkpoint_shard_files for an index, else the one file
    build          under models.modeling_utils.no_init_weights + accelerate.init_empty_weights
    read           models.model_loading_utils.load_state_dict (a whole file at a time)
    assign         ModelMixin._load_pretrained_model -> _load_shard_file ->
                   load_model_dict_into_meta -> accelerate's set_module_tensor_to_device
    place          accelerate.dispatch_model, then model.eval()

from_pretrained itself needs a diffusers class and a folder in diffusers' naming; the suite hands
any `build` callable and any checkpoint path, so the adapter converts those (a folder or file to
diffusers' file list) and nothing else. It converts types only: every check, refusal, dtype
conversion and placement is diffusers' (or accelerate's) own, never re-implemented here; where
diffusers raises, its error passes through, except that `inspect_checkpoint` and
`read_checkpoint_tensor` convert diffusers' errors into the `CheckpointError` the adapter Protocol
names. Options diffusers' loading does not have (a decode dtype, channels_last_3d, quantizers the
adapter does not plumb) raise the seam's Unsupported (the test is skipped), so no rule is
credited for them.

Capabilities: `vae_stream` (what from_pretrained does for a VAE) and `checkpoint_safety` (its
reader). Zero-copy DiT loading, plans, flags, admission and pipelines are sglang-loader concepts
diffusers has no functions for; they are not declared.

diffusers and accelerate are imported on first use, so `reference` imports without them; the
meta-device path needs both (the [diffusers] extra brings them: `reference.extras.install_hint`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.errors import CheckpointError
from reference.extras import install_hint
from reference.kit.seam import CHECKPOINT_SAFETY, VAE_STREAM, Unsupported, VaeRequest
from reference.place.records import TensorRecord
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan
from reference.request.quantization import QuantizationSpec

__all__ = [
    "DIFFUSERS_ERRORS",
    "INDEX_SUFFIX",
    "NEEDS",
    "WEIGHTS_GLOBS",
    "Diffusers",
    "DiffusersLoader",
    "WeightFiles",
    "checkpoint_error",
    "mapped_ranges",
    "resolve",
    "weight_files",
]

INDEX_SUFFIX = ".safetensors.index.json"
NEEDS = f"needs the diffusers extra, which brings accelerate: {install_hint('diffusers')}"
# from_pretrained's file fallbacks, in its order: an index, the safetensors file, the pickle file.
WEIGHTS_GLOBS = ("*.safetensors", "*.bin")
# What diffusers' readers raise on purpose for a bad file or index: load_state_dict re-raises
# every failure as OSError, the index reader raises ValueError or FileNotFoundError. Anything
# else (a KeyError or AttributeError on a malformed index) is a crash of diffusers' reader and
# passes through unconverted, as CKPT-4 should see it.
DIFFUSERS_ERRORS = (OSError, ValueError)


class Diffusers:
    """diffusers' and accelerate's loading functions, imported on first use.

    Each attribute is the library's own object (typed Any: the adapter passes values through).
    """

    def __init__(self) -> None:
        try:
            utils = importlib.import_module("diffusers.models.model_loading_utils")
            modeling = importlib.import_module("diffusers.models.modeling_utils")
            hub = importlib.import_module("diffusers.utils.hub_utils")
            quantizers = importlib.import_module("diffusers.quantizers")
            accelerate = importlib.import_module("accelerate")
        except ImportError as error:
            raise ImportError(f"DiffusersLoader {NEEDS} ({error})") from error
        logging: Any = importlib.import_module("diffusers.utils.logging")
        logging.disable_progress_bar()
        self.load_state_dict: Any = utils.load_state_dict
        self.model_mixin: Any = modeling.ModelMixin
        self.no_init_weights: Any = modeling.no_init_weights
        self.shard_files: Any = hub._get_checkpoint_shard_files
        self.auto_quantizer: Any = quantizers.DiffusersAutoQuantizer
        self.init_empty_weights: Any = accelerate.init_empty_weights
        self.dispatch_model: Any = accelerate.dispatch_model


@dataclass(frozen=True)
class WeightFiles:
    """A checkpoint path in diffusers' terms.

    Attributes:
        files: the weight files from_pretrained would read, in its order.
        keys: the names from the index (`all_checkpoint_keys`); None for one unindexed file.
        folder: where the files are.
    """

    files: tuple[str, ...]
    keys: tuple[str, ...] | None
    folder: str


def resolve(path: str | os.PathLike[str]) -> Path:
    """The index or weights file diffusers starts from for `path`.

    A file is itself. A folder's index is diffusers' sharded case; otherwise its one weights
    file, safetensors first, then a `.bin` (from_pretrained's pickle fallback). The suite names
    files its own way, so the folder lookup is by suffix rather than by diffusers' fixed names.

    Raises:
        FileNotFoundError: a folder with no such file (as from_pretrained's `_get_model_file`).
    """
    path = Path(path)
    if not path.is_dir():
        return path
    indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
    if indexes:
        return indexes[0]
    for pattern in WEIGHTS_GLOBS:
        found = sorted(path.glob(pattern))
        if len(found) == 1:
            return found[0]
    raise FileNotFoundError(f"{path}: no single weights file ({' or '.join(WEIGHTS_GLOBS)})")


def weight_files(lib: Diffusers, path: Path) -> WeightFiles:
    """The files diffusers reads from `path`, an index or a weights file (see `resolve`).

    Raises:
        Whatever diffusers' `_get_checkpoint_shard_files` raises for a bad index.
    """
    if path.name.endswith(INDEX_SUFFIX):
        files, metadata = lib.shard_files(str(path.parent), str(path))
        return WeightFiles(tuple(files), tuple(metadata["all_checkpoint_keys"]), str(path.parent))
    return WeightFiles((str(path),), None, str(path.parent))


def checkpoint_error(file: str | os.PathLike[str], error: BaseException) -> CheckpointError:
    """diffusers' error as the Protocol's type: its message, on one line, for `file`."""
    message = " ".join(str(error).split()) or type(error).__name__
    return CheckpointError(str(file), None, f"{type(error).__name__}: {message}")


def mapped_ranges(files: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """Address ranges where the process maps `files` (Linux /proc/self/maps); None elsewhere.

    Evidence for the report: a slot whose data lies in one of them is the file's tensor itself.
    """
    wanted = {os.path.realpath(f) for f in files}
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.realpath(fields[5]) in wanted:
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


class DiffusersLoader:
    """diffusers' `from_pretrained` loading (meta-device path) as a conformance-suite adapter."""

    name = "diffusers"
    capabilities: frozenset[str] = frozenset({VAE_STREAM, CHECKPOINT_SAFETY})

    def __init__(self) -> None:
        self.lib = Diffusers()

    # --- VAE -----------------------------------------------------------------------------------
    def vae_state_slots(self, module: nn.Module) -> frozenset[str]:
        """The keys from_pretrained fills: `model.state_dict()` (its `expected_keys`)."""
        return frozenset(module.state_dict())

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        """from_pretrained's steps with `device_map={"": device}` and `low_cpu_mem_usage=True`.

        `config` is the component's config.json (diffusers reads its `quantization_config`);
        `quantization` becomes from_pretrained's `quantization_config` argument as a dict.

        Raises:
            Unsupported: `decode_dtype` or `channels_last_3d` (diffusers' loading has
                neither), or a quantizer diffusers accepts (the adapter does not plumb one).
            Whatever diffusers raises, unchanged.
        """
        if request.decode_dtype is not None or request.channels_last_3d:
            raise Unsupported(
                "diffusers' from_pretrained has no decode_dtype or channels_last_3d option"
            )
        lib = self.lib
        device_map = {"": request.device}
        quantizer = self._quantizer(request.config, request.quantization)
        if quantizer is not None:
            raise Unsupported(
                f"{request.component}: diffusers accepted quantizer {type(quantizer).__name__}; "
                "this adapter does not plumb diffusers quantizers"
            )
        where = weight_files(lib, resolve(request.checkpoint))
        with contextlib.ExitStack() as stack:
            stack.enter_context(lib.no_init_weights())
            stack.enter_context(lib.init_empty_weights())
            model = request.build()
        owner: Any = type(model) if isinstance(model, lib.model_mixin) else lib.model_mixin
        state_dict: Any = None
        if where.keys is None:
            state_dict = lib.load_state_dict(where.files[0])
            if isinstance(model, lib.model_mixin):
                model._fix_state_dict_keys_on_load(state_dict)
            keys = list(state_dict)
        else:
            keys = list(where.keys)
        keep_fp32 = owner._keep_in_fp32_modules
        loaded = owner._load_pretrained_model(
            model,
            state_dict,
            list(where.files),
            where.folder,
            keys,
            low_cpu_mem_usage=True,
            device_map=device_map,
            dtype=request.dtype,
            keep_in_fp32_modules=[] if keep_fp32 is None else list(keep_fp32),
        )
        model, _missing, _unexpected, _mismatched, offload_index, _errors = loaded
        del state_dict
        lib.dispatch_model(model, device_map=device_map, offload_index=offload_index)
        model.eval()
        plan = WeightLoadPlan(checkpoint_load_device=request.device)
        return model, LoadReport(request.component, plan, self._records(model, keys, where.files))

    def _quantizer(
        self, config: Mapping[str, object] | None, quantization: QuantizationSpec | None
    ) -> Any:
        """from_pretrained's quantizer resolution (None when nothing asks for quantization)."""
        auto = self.lib.auto_quantizer
        stored = None if config is None else config.get("quantization_config")
        # the request as the config object from_pretrained's `quantization_config` takes
        requested = (
            None if quantization is None else auto.from_dict({"quant_method": quantization.method})
        )
        if stored is None and requested is None:
            return None
        if stored is not None:
            merged = auto.merge_quantization_configs(stored, requested)
            return auto.from_config(merged, pre_quantized=True)
        return auto.from_config(requested, pre_quantized=False)

    @staticmethod
    def _records(
        model: nn.Module, keys: list[str], files: tuple[str, ...]
    ) -> tuple[TensorRecord, ...]:
        """One record per checkpoint tensor diffusers placed in a slot: "adopted" when the slot
        holds the file's mapped tensor itself, else "copied". None when the maps are unreadable."""
        ranges = mapped_ranges(files)
        if ranges is None:
            return ()
        held = model.state_dict(keep_vars=True)
        records = []
        for name in keys:
            tensor = held.get(name)
            if tensor is None or tensor.is_meta:
                continue
            inside = any(lo <= tensor.data_ptr() < hi for lo, hi in ranges)
            records.append(TensorRecord(name, "adopted" if inside else "copied", tensor.nbytes))
        return tuple(records)

    # --- checkpoints -----------------------------------------------------------------------------
    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> Mapping[str, tuple[torch.dtype, tuple[int, ...]]]:
        """What diffusers' `load_state_dict` returns for each file, as (dtype, shape) by name.

        Raises:
            CheckpointError: diffusers' reader raised; `file` is the file (or index) it was
                reading, `entry` None (diffusers names none).
        """
        listed: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        for _file, state in self._read(path, torch.device("cpu")):
            listed.update({n: (t.dtype, tuple(t.shape)) for n, t in state.items()})
        return listed

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        """`name` as diffusers' `load_state_dict(file, map_location=device)` reads it, from the
        last file holding it (diffusers assigns the files in order, so the last one wins).

        Raises:
            CheckpointError: diffusers' reader raised (as `inspect_checkpoint`), or no file
                holds `name` (`file` is `path`, `entry` is `name`).
        """
        found: torch.Tensor | None = None
        for _file, state in self._read(path, device):
            found = state.get(name, found)
        if found is None:
            raise CheckpointError(str(path), name, "no file of the checkpoint holds this tensor")
        return found

    def _read(
        self, path: str | os.PathLike[str], device: torch.device
    ) -> Iterator[tuple[str, Mapping[str, torch.Tensor]]]:
        """Each weight file with diffusers' reading of it, one file at a time; diffusers' errors
        as CheckpointError naming the folder, index or file it was reading."""
        try:
            start = resolve(path)
        except OSError as error:
            raise checkpoint_error(path, error) from error
        try:
            where = weight_files(self.lib, start)
        except DIFFUSERS_ERRORS as error:
            raise checkpoint_error(start, error) from error
        for file in where.files:
            try:
                state: Mapping[str, torch.Tensor] = self.lib.load_state_dict(
                    file, map_location=str(device)
                )
            except DIFFUSERS_ERRORS as error:
                raise checkpoint_error(file, error) from error
            yield file, state
