"""Fakes for the conformance suite: small real implementations (modules, files, platforms).

Every fake is a working object passed in where the real thing would be, never a Mock standing in
for the code under test.
"""

__all__: list[str] = []
