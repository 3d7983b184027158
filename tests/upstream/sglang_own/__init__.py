"""Running SGLang's own scheduling unit tests on SGLang's classes and with policykit's plugin."""
