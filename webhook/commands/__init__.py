"""Commands that belong to no single room: dry-run, demo, policy export."""
