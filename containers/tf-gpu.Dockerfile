# The TensorFlow GPU training image: CUDA 12, TensorFlow's CUDA build with its CUDA 12 libraries, tf_keras, Horovod
# with NCCL for GPU operations and with MPI and Gloo, OpenMPI, and the training package (trainer/tf/loop.py and
# trainer/tf/fit.py under horovodrun). No torch: the TensorFlow trainers never import it.
#
# Build it on any machine with Docker and internet access, from the repository root:
#   docker build -f containers/tf-gpu.Dockerfile -t trainflow-tf-gpu containers
# (`trainflow build` with a TensorFlow framework and image.flavour gpu does the same and also tags by content and
# pushes.) TensorFlow 2.21's `and-cuda` extra installs CUDA 12 libraries from PyPI (cuDNN 9, NCCL 2; pinned in
# requirements/tensorflow-gpu.txt), which TensorFlow finds by itself; the base, CUDA 12 like them (the PyTorch image's
# is CUDA 13), gives the CUDA compiler that Horovod's NCCL operations are compiled with.
ARG BASE_IMAGE=nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}
# TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras (Keras 2), which Horovod's Keras API works with; Keras 3 does not
# (horovod#4290).
ENV DEBIAN_FRONTEND=noninteractive VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TF_USE_LEGACY_KERAS=1
# The system packages are gpu.Dockerfile's (its comments say why each), less libjpeg-dev: the fast loader's JPEG
# decoder (trainer/jpeg_crop.py) is the PyTorch trainer's.
# patch: horovod-wheel.sh applies build/horovod-idle-cycle.patch and build/horovod-tensorflow.patch to Horovod's sdist.
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-dev python3-venv g++ make cmake git patch openmpi-bin libopenmpi-dev \
      openssh-server openssh-client \
      nfs-common util-linux rdma-core libibverbs1 ibverbs-providers \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd && python3 -m venv /opt/venv
COPY requirements/ /opt/trainflow/requirements/
# TensorFlow's CUDA build; the rest of TensorFlow's dependencies at the CPU image's versions (tensorflow.txt as
# constraints). tf-keras with --no-deps, as everywhere (requirements/tf-keras.txt says why).
RUN pip install -r /opt/trainflow/requirements/tensorflow-gpu.txt -c /opt/trainflow/requirements/tensorflow.txt \
      -r /opt/trainflow/requirements/image.txt \
 && pip install --no-deps -r /opt/trainflow/requirements/tf-keras.txt
COPY build/ /tmp/build/
# Horovod: NCCL for GPU allreduce (the NCCL of the nvidia-nccl-cu12 wheel, the one TensorFlow uses), MPI and Gloo as
# controllers. HOROVOD_NCCL_LINK=SHARED: pip's NCCL wheel has only libnccl.so.2, no libnccl_static.a (gpu.Dockerfile
# says more). Only TensorFlow is installed, so horovod-wheel.sh builds Horovod for TensorFlow alone.
RUN NCCL=$(python -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])') \
 && ln -sf libnccl.so.2 "$NCCL/lib/libnccl.so" \
 && HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_MPI=1 HOROVOD_NCCL_HOME="$NCCL" HOROVOD_NCCL_LINK=SHARED \
    /tmp/build/horovod-wheel.sh python /tmp/wheels \
 && pip install --no-deps /tmp/wheels/horovod-*/horovod-*.whl && rm -rf /tmp/wheels \
 && horovodrun --check-build
COPY nodelib/ /opt/trainflow/nodelib/
COPY trainer/ /opt/trainflow/trainer/
# The rank shim a user's own script runs under (its lines prefixed with the rank); the scripts come mounted.
COPY scriptrun/ /opt/trainflow/scriptrun/
WORKDIR /opt/trainflow
# NCCL: as in gpu.Dockerfile (warnings only; no InfiniBand unless NCCL_IB_DISABLE=0 on nodes that have it; not on the
# loopback and Docker bridges). Run with --ipc=host or --shm-size=16g: NCCL and the data loaders use /dev/shm.
# TRAINFLOW_TRAINER: the TensorFlow trainer (training.framework tensorflow); the Keras one is trainer/tf/fit.py beside it.
ENV NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=^lo,docker0 NCCL_IB_DISABLE=1 \
    TRAINFLOW_TRAINER=/opt/trainflow/trainer/tf/loop.py
LABEL org.opencontainers.image.title="trainflow-tf-gpu" org.opencontainers.image.source="containers/tf-gpu.Dockerfile"
CMD ["python", "/opt/trainflow/trainer/tf/loop.py", "--help"]
