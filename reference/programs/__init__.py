"""The programs built on the library: the command line (`cli`), the demo (`demo`) and the
benchmark (`bench`). The library never imports them."""

__all__: list[str] = []
