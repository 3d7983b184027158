"""SGLang 0.5.23 as a conformance oracle: its real scheduler and storage code on a CPU."""
