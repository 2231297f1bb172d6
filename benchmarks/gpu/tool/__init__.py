"""The GPU tool: named server variants and named experiments (benchmarks/gpu/experiments.toml), run by name.

`python3 -m benchmarks.gpu.tool --help` (see __main__.py) from the repository root.
"""
