"""The small core every other layer uses: the error classes and retry rule, redaction of secrets, JSON files
written whole. It imports nothing of the project."""
