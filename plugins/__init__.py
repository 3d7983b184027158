"""Built-in policies, registered through the same hook as any third-party plugin."""

from policykit.plugins import admission, alignment, allocator_phase, chunking, queue

BUILTIN_PLUGINS = (admission, chunking, alignment, allocator_phase, queue)
