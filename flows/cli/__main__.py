"""`python -m flows.cli`: the `trainflow` command."""

from flows.cli import main

main()
