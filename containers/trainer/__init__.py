"""The trainer: one training loop for torchvision image classifiers, data-parallel or pipeline-parallel.

It runs on the pool and never imports the orchestrator. `train.py` is the entry point; the other
modules are the pieces it reads like a document: arguments, data, models, the distributed backend
seam, the learning-rate schedule, checkpoints and metrics.
"""
