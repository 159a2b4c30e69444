"""Judging a loader by what it does: refusals by contract (judge), what a call read (evidence),
whether a tensor was adopted or copied (file_maps), files a load must not write and errors it
must raise (guards), and the paths a checkpoint takes through the seam (load_paths).

These sit above the fakes: they drive a loader over the fakes' models and files.
"""

__all__: list[str] = []
