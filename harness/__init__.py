"""Real prefill through the core scheduler: a Llama-style model whose KV cache is the token pool,
workloads sized to the pool, and a runner that compares policy combinations (``policykit
bench``). See ``docs/harness.md``."""
