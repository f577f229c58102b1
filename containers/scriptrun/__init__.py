"""A user's own training script on the nodes: rank.py runs it as one rank of a launcher (torchrun, horovodrun)."""
