"""Built-in policies, registered through the same hook as any third-party plugin.

:data:`policykit.plugin_manager.BUILTIN_PLUGINS` names each module here; the plugin manager
imports them by name when it builds a manager.
"""
