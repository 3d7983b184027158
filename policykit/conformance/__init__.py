"""Conformance with real serving engines: their schedulers driven on a CPU, step by step."""
