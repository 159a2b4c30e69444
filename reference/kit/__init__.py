"""The conformance kit: what judges a loader, as opposed to the loader itself.

seam (the one seam: LoaderAdapter, and the request values it takes) -> selection (--loader) ->
plugin (pytest: rules, the `loader` fixture, expectations, the report) -> conformance (per-rule
outcomes) -> matrix (several reports side by side). `adapters/` holds the loaders put behind the
seam (the reference, diffusers, sglang, the plain-PyTorch baselines); `judging/` the helpers that
judge what a loader did (refusals, the evidence a call leaves, file maps, sealed files, the load
paths); expectations reads a loader's declared known failures. The models, checkpoints and broken
loaders the suite judges with are the top-level package `fakes`, beside this one.
"""

__all__: list[str] = []
