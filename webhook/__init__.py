"""The gpu-admission application: CLI, admission webhook, dry-run and their adapters."""
