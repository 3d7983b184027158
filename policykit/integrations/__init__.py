"""Adapters that let policykit policies decide inside a real serving engine (optional extras)."""
