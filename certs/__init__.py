"""Pure certificate issuing for the webhook: a private CA and its serving certificates (no I/O)."""
