"""Orchestration: the command line, the flows, the deploy script. No SDK calls live here."""
