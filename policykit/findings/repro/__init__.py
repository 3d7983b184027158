"""Reproducers of the findings on the engines' own classes (docs/findings/)."""
