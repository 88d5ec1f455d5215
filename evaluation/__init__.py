"""Evaluation of nanonorm checkpoints: strided perplexity on prepared splits, zero-shot benchmarks
through lm-evaluation-harness, and the JSON / markdown / wandb report. Entry point: eval.py."""
