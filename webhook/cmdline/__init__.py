"""What every command shares: flags, durations, the one input error, shell completion."""
