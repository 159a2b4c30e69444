"""The suite's plugin, for every run from a clone (installed or not: the package registers no
pytest entry point, so nothing loads it into other pytest runs)."""

pytest_plugins = ["reference.kit.plugin"]
