"""Local services trainflow starts and stops itself (Azurite, dockerd, a registry, Prefect's server), each on a
leash (leash.py) so that nothing outlives trainflow. May import: infra.core."""
