# The CPU training image: the local pool's container runtime (Horovod and torch.distributed over Gloo).
#
# Build it with `trainflow build` (flavour cpu). That assembles the context from this folder: the
# training package, build/, requirements/, and a wheels/ folder holding the Horovod sdist and the
# pinned wheels of requirements/image.txt, so that this build needs no package index (it is hermetic
# and its tag can be computed from its inputs). torch comes from the base image if the base already
# holds the pinned version (pip then downloads nothing), else from TORCH_INDEX_URL (CPU wheels).
ARG BASE_IMAGE=python:3.11.7-slim-bookworm
FROM ${BASE_IMAGE} AS base
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY requirements/ /opt/trainflow/requirements/
RUN ([ -x /opt/venv/bin/python ] || python3 -m venv /opt/venv) \
 && pip install --index-url "$TORCH_INDEX_URL" -r /opt/trainflow/requirements/torch.txt

# Horovod is compiled in a stage of its own so the compilers stay out of the image.
FROM base AS horovod
# patch: horovod-wheel.sh applies build/horovod-idle-cycle.patch to Horovod's sdist.
RUN apt-get update && apt-get install -y --no-install-recommends g++ make cmake patch \
 && rm -rf /var/lib/apt/lists/*
COPY wheels/ /tmp/wheels/
COPY build/ /tmp/build/
RUN pip install --no-index --find-links /tmp/wheels -r /opt/trainflow/requirements/image.txt \
 && /tmp/build/horovod-wheel.sh python /tmp/wheels

# The fast loader's partial JPEG decoding (trainer/jpeg_crop.c), compiled here too: no compiler in the image.
FROM base AS jpeg
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libjpeg-dev \
 && rm -rf /var/lib/apt/lists/*
COPY trainer/jpeg_crop.c trainer/jpeg_crop.py /tmp/jpeg_crop/
RUN python /tmp/jpeg_crop/jpeg_crop.py /opt/trainflow/lib

FROM base
# OpenSSH: horovodrun starts the workers of other nodes over SSH, as on Azure ML and Batch clusters.
# libjpeg62-turbo: what the partial JPEG decoder is linked against.
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server openssh-client libjpeg62-turbo \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd
COPY --from=horovod /tmp/wheels/ /tmp/wheels/
RUN pip install --no-index --find-links /tmp/wheels -r /opt/trainflow/requirements/image.txt /tmp/wheels/horovod-*/horovod-*.whl \
 && rm -rf /tmp/wheels && horovodrun --check-build
COPY nodelib/ /opt/trainflow/nodelib/
COPY trainer/ /opt/trainflow/trainer/
# The rank shim a user's own script runs under (its lines prefixed with the rank); the scripts come mounted.
COPY scriptrun/ /opt/trainflow/scriptrun/
COPY --from=jpeg /opt/trainflow/lib/ /opt/trainflow/lib/
WORKDIR /opt/trainflow
ENV TRAINFLOW_JPEG_CROP_DIR=/opt/trainflow/lib
# Workers share their data loaders through /dev/shm: run with --shm-size (the pool gives 1 GB) or --ipc=host.
ENV TRAINFLOW_TRAINER=/opt/trainflow/trainer/train.py
LABEL org.opencontainers.image.title="trainflow-cpu" org.opencontainers.image.source="containers/cpu.Dockerfile"
CMD ["python", "/opt/trainflow/trainer/train.py", "--help"]
