"""Step 3, placing: tensors into a module's slots, and what follows.

The module build on meta and its slots (`modules`, `slots`), host memory a build may take
(`host_memory`), the component's precision given to its slots (`cast`), zero-copy adoption and
the full-state load (`adopt`), per-tensor streaming (`stream`), what happens after the tensors
are in (`postload`, `vae_postload`), diffusers' own classes (`diffusers_models`), and one record
per tensor placed (`records`). Imports the request and reading, never the report.
"""

__all__: list[str] = []
