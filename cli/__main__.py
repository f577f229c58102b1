"""`python -m cli`: the `trainflow` command."""

from cli import main

main()
