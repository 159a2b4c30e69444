"""Step 2, reading: a component's checkpoint files, from header to tensors.

Safetensors headers checked without reading data (`header`), the checkpoint with its shard index
and a tensor-at-a-time reader (`checkpoint`), how many bytes may be in flight and with how many
threads (`reading`, `pool`), the page-cache warm-up beside zero-copy reads (`prefetch`), and the
device-memory preflight that needs only headers (`preflight`). Imports the request, never
the steps after it.
"""

__all__: list[str] = []
