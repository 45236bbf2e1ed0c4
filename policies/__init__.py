"""Pure GPU policy evaluation: the vocabulary, the engine and the built-in policies (no I/O)."""
