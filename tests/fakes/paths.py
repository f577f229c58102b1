"""Where the tests find the checkout and the commands of the Python that runs them."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # tests/fakes/paths.py -> the checkout
BIN = Path(sys.executable).parent  # the venv's commands: trainflow, prefect, ...
