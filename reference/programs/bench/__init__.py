"""The benchmark: `python -m reference bench` measures every loading path side by side.

command (the CLI and the medians) -> runner (one run in a fresh process) -> paths (what each
path loads) -> ratios (the claims and their targets) -> report (the table).

`--gpu` (the GPU table alone): gpu (the CLI, the medians, the fresh interpreters) -> gpu_rows
(each row's load on a device, and one measured run) -> gpu_limits (the file-to-device limits)
-> gpu_ratios (targets and verdicts) -> gpu_report (the table); wan writes its Wan DiT, and
gpu_check is the summary that `.ci/gpu-check.sh` ends with.
"""

__all__: list[str] = []
