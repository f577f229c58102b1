"""The data set on the orchestrator: its SQLite index and manifest (manifest.py), the sample data sets
(sample_data.py), the sizes of a few of a folder's images (image_sizes.py), JPEG rewriting with restart markers
(restart_markers.py). May import: infra.core, and the trainer's contract modules (nodelib.staged, nodelib.layout,
nodelib.errors, trainer.jpeg_crop)."""
