"""The training image: its config, the Docker engine and registry (registry.py), the hashed build context
(build_context.py) and the local engine and registry the tests and the docker pool start (local_docker.py).
May import: infra.services, infra.core."""
