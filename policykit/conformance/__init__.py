"""Conformance oracles: engines' real scheduler code, driven from policykit scenarios and
compared with policykit's own runs (one subpackage per engine: SGLang 0.5.23, vLLM 0.33.0),
behind the engine's extra. Not to be confused with :mod:`policykit.integrations`, which runs
policykit inside an engine."""
