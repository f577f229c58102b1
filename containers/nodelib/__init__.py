"""trainflow's node-side library: what runs on every node for any program, and what the orchestrator reads of it.

The records a rank writes (its events, metrics.json), the errors of bad input, the scripts version's check, the cores
a process may use, the data layouts and the decode check, the staged data set's format and its fetch onto a node, and
where a rank may write. The built-in trainer (trainer/) and a user's script's rank shim (scriptrun/) both run on it;
a script run needs only this. The standard library, with Pillow (and numpy) for the decode check: it runs in every
image and on every node.
"""
