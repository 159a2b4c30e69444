"""The contract tests. Installed, they are the package `reference.kit.suite` (pyproject.toml)."""
