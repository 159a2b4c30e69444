"""The spine: a load runs the steps in order, each once per component.

`pipeline.load_pipeline` reads the request and admits it, then hands each component to its
loader (`loaders`), whose `load_dit` (`dit`) or `load_vae` (`vae`) reads and places the
component's tensors and returns its report. The steps (`reference.request`, `.read`, `.place`,
`.report`) never import the spine; docs/flow.md shows the call order.
"""

__all__: list[str] = []
