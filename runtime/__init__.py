"""What training, eval.py and sample.py share at run time: device, precision and the process group
(`runtime.distributed`), and checkpoint files (`runtime.checkpoint`)."""
