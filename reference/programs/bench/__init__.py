"""The benchmark: `python -m reference bench` measures every loading path side by side.

command (the CLI and the medians) -> runner (one run in a fresh process) -> paths (what each
path loads) -> ratios (the claims and their targets) -> report (the table).
"""

__all__: list[str] = []
