import os

# The suite runs two test processes on 2 cores, each starting trainings beside services: OpenMP threads that spin
# while they wait for work (libgomp's default) take the cores from the processes they wait on. Passive waiting, set
# here (imported before tests/conftest.py loads torch) and inherited by every process the tests start, took a
# one-process training's CPU time from 36 s to 21-24 s on 2 loaded cores (2026-12-03). Users' runs keep the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
