"""nanonorm's training loop: config, distributed setup, optimizer, checkpoints, monitoring, sinks."""
