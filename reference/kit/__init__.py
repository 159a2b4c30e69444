"""The conformance kit: what judges a loader, as opposed to the loader itself.

adapter (the one seam: LoaderAdapter) -> selection (--loader) -> plugin (pytest: rules, the
`loader` fixture, expectations, the report) -> conformance (per-rule outcomes) -> matrix (several
reports side by side). reference_adapter, diffusers_adapter and baseline are loaders put behind
the seam; expectations reads a loader's declared known failures.
"""

__all__: list[str] = []
