"""What every HTTPS server of the package shares: TLS with hot reload, workers, metrics."""
