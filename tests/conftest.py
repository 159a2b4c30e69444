"""The suite's plugin, for runs from a clone that did not install the package (`tox -e gpu`, a
bare venv): an installed package registers the same module through its `pytest11` entry point,
and pytest loads it once."""

pytest_plugins = ["reference.kit.plugin"]
