"""Step 1, the request: what to load and how, decided before a byte of weights is read.

The serving arguments (`args`), the pipeline folder and its model classes (`model_index`), the
three admission gates (`admission`), each component's plan (`plan`), precision and
quantization, and the machine's CUDA facts (`platform`). Nothing here opens a checkpoint.
"""

__all__: list[str] = []
