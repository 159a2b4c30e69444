"""The doubles the conformance suite loads: small real modules, real checkpoint and pipeline
folders, bad and hostile inputs, platform fakes, and loaders with one defect each (`broken`,
`reworded`).

Every fake is a working object passed in where the real thing would be, never a Mock standing in
for the code under test. The loader (`reference` outside `reference.kit` and
`reference.programs`) never imports this package; what judges a loader lives in
`reference.kit.judging`.
"""

__all__: list[str] = []
