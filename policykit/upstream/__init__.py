"""Drivers for real engine scheduler code (SGLang 0.5.23), behind the ``sglang`` extra."""
