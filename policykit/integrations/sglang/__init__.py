"""policykit as an SGLang plugin: the registered policies decide inside SGLang's ``PrefillAdder``.

SGLang (0.5.23) discovers general plugins through the entry-point group ``sglang.srt.plugins``
and runs each one's callable before applying the hooks registered with its ``HookRegistry``.
This package is that plugin (:func:`policykit.integrations.sglang.plugin.load`). Importing it
does not import SGLang; only enabling the plugin does.
"""
