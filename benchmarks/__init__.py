"""Benchmarks and measurements (each script runs as a file; ``benchmarks.gpu.tool`` runs as a module).

A regular package, so ``python3 -m benchmarks.gpu.tool`` from the repository root finds this folder even where an
installed distribution ships a top-level ``benchmarks`` package of its own.
"""
