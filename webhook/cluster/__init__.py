"""The local cluster for tests and demos: a real control plane built from source, with fake GPU nodes."""
