# The TensorFlow CPU training image: the local pools' container runtime for training.framework tensorflow and keras
# (trainer/tf/loop.py and trainer/tf/fit.py under horovodrun, Horovod over Gloo). It holds no torch: the TensorFlow
# trainers never import it.
#
# Build it with `trainflow build` and a TensorFlow framework (flavour cpu). That assembles the context from this
# folder: the training package, build/, requirements/, and a wheels/ folder holding the Horovod sdist and the pinned
# wheels of requirements/image.txt, tensorflow.txt and tf-keras.txt for the image's Python, so that this build needs
# no package index (it is hermetic and its tag can be computed from its inputs). The base needs Python 3.11 alone
# (`image.base_image: local` gives Debian's, without the torch of the PyTorch image's local base).
ARG BASE_IMAGE=python:3.11.7-slim-bookworm
FROM ${BASE_IMAGE} AS base
# TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras (Keras 2), which Horovod's Keras API works with; Keras 3 does not
# (horovod#4290).
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_USE_LEGACY_KERAS=1
COPY requirements/ /opt/trainflow/requirements/

# TensorFlow, tf_keras and Horovod compiled against them, in a venv made in a stage of its own: the compilers and the
# wheels stay out of the image, which copies the venv alone.
FROM base AS venv
# patch: horovod-wheel.sh applies build/horovod-idle-cycle.patch and build/horovod-tensorflow.patch to Horovod's sdist.
RUN apt-get update && apt-get install -y --no-install-recommends g++ make cmake patch \
 && rm -rf /var/lib/apt/lists/*
COPY wheels/ /tmp/wheels/
# tf-keras with --no-deps: its metadata asks for the full `tensorflow` wheel; tensorflow-cpu is the same package.
RUN python3 -m venv /opt/venv \
 && pip install --no-index --find-links /tmp/wheels \
      -r /opt/trainflow/requirements/image.txt -r /opt/trainflow/requirements/tensorflow.txt \
 && pip install --no-index --find-links /tmp/wheels --no-deps -r /opt/trainflow/requirements/tf-keras.txt
# Only TensorFlow is installed here, so horovod-wheel.sh builds Horovod for TensorFlow alone (with Gloo).
COPY build/ /tmp/build/
RUN /tmp/build/horovod-wheel.sh python /tmp/wheels \
 && pip install --no-index --no-deps /tmp/wheels/horovod-*/horovod-*.whl

FROM base
# OpenSSH: horovodrun starts the workers of other nodes over SSH, as on Azure ML and Batch clusters.
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd
COPY --from=venv /opt/venv/ /opt/venv/
RUN horovodrun --check-build
COPY nodelib/ /opt/trainflow/nodelib/
COPY trainer/ /opt/trainflow/trainer/
# The rank shim a user's own script runs under (its lines prefixed with the rank); the scripts come mounted.
COPY scriptrun/ /opt/trainflow/scriptrun/
WORKDIR /opt/trainflow
# Workers share their data loaders through /dev/shm: run with --shm-size (the pool gives 1 GB) or --ipc=host.
# TRAINFLOW_TRAINER: the TensorFlow trainer (training.framework tensorflow); the Keras one is trainer/tf/fit.py beside it.
ENV TRAINFLOW_TRAINER=/opt/trainflow/trainer/tf/loop.py
LABEL org.opencontainers.image.title="trainflow-tf-cpu" org.opencontainers.image.source="containers/tf-cpu.Dockerfile"
CMD ["python", "/opt/trainflow/trainer/tf/loop.py", "--help"]
