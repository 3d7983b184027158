"""GPU memory: sizing the KV pool and steering torch's caching allocator.

Two halves that share the model's shape and the allocator facade:

* sizing -- :mod:`~policykit.memory.model_shapes` (the numbers of a model),
  :mod:`~policykit.memory.plan` (weights, KV pool and headroom on a device),
  :mod:`~policykit.memory.activation_peak` (the forward pass's transient peak) and
  :mod:`~policykit.memory.measure` (the same figures measured on a CUDA device);
* the allocator -- :mod:`~policykit.memory.allocator` (the one facade over torch's internals),
  :mod:`~policykit.memory.allocator_settings`, :mod:`~policykit.memory.expandable` (switching
  expandable segments at run time), :mod:`~policykit.memory.watermark` and
  :mod:`~policykit.memory.oom_chain` (finding a CUDA OOM in an exception chain).

Nothing here imports the scheduler; the scheduler core does not import this package either
(the allocator-phase plugins, the harness and ``policykit plan-memory`` do). The package
imports nothing itself, so sizing a model does not load torch.
"""
