# The GPU training image: CUDA 13, torch at the project's pins, Horovod with NCCL for GPU operations
# and with MPI and Gloo, OpenMPI, and the training package.
#
# Build it on any machine with Docker and internet access, from the repository root:
#   docker build -f containers/gpu.Dockerfile -t trainflow-gpu containers
# (`trainflow build --config flows/configs/azure.yaml` does the same and also tags by content and pushes.)
# The torch 2.14.1 wheels on PyPI are built for CUDA 13.0 and bring their own CUDA runtime, cuDNN and
# NCCL; the base gives the CUDA compiler that Horovod's NCCL operations are compiled with.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# nfs-common: mount.nfs, for the per-node mount of the NFS file server (Azure Files NFS 4.1; Azure's Linux mount
#   steps install it: https://learn.microsoft.com/azure/storage/files/storage-files-how-to-mount-nfs-shares).
# util-linux: flock and mountpoint, which the per-node mount step uses (one mount per node, skipped when mounted;
#   https://packages.ubuntu.com/noble/util-linux lists /usr/bin/flock and /usr/bin/mountpoint).
# patch: horovod-wheel.sh applies build/horovod-idle-cycle.patch to Horovod's sdist.
# libjpeg-dev: the fast loader's partial JPEG decoder (trainer/jpeg_crop.c) is compiled against it below.
# rdma-core, libibverbs1, ibverbs-providers: the verbs library and the mlx5 provider of the InfiniBand NICs on
#   Azure's ND/NC..r sizes. NCCL opens libibverbs.so.1 at run time and, without it, warns "Failed to open
#   libibverbs.so[.1]" and falls back to TCP sockets (NVIDIA/nccl src/misc/ibvwrap.cc, ibvsymbols.cc in newer
#   releases; https://learn.microsoft.com/azure/virtual-machines/extensions/enable-infiniband).
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-dev python3-venv g++ make cmake git patch openmpi-bin libopenmpi-dev \
      openssh-server openssh-client libjpeg-dev \
      nfs-common util-linux rdma-core libibverbs1 ibverbs-providers \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd && python3 -m venv /opt/venv
COPY requirements/ /opt/trainflow/requirements/
RUN pip install -r /opt/trainflow/requirements/torch.txt -r /opt/trainflow/requirements/image.txt
# NVIDIA DALI: --loader dali decodes JPEGs on the GPU (nvJPEG through nvImageCodec, wheels that bring their own).
RUN pip install -r /opt/trainflow/requirements/dali.txt
COPY build/ /tmp/build/
# Horovod: NCCL for GPU allreduce (the NCCL that torch's wheels bring), MPI and Gloo as controllers.
# HOROVOD_NCCL_LINK=SHARED: pip's nvidia-nccl wheel has only libnccl.so.2 (no libnccl_static.a), and unset,
# Horovod links NCCL statically for CUDA ("HOROVOD_NCCL_LINK - {SHARED, STATIC}. Mode to link NCCL library.
# Defaults to STATIC for CUDA": horovod/horovod docs/install.rst; cmake/Modules/FindNCCL.cmake looks for
# libnccl_static.a unless SHARED, then find_library(nccl), hence the libnccl.so link). Linked shared, Horovod
# uses the same libnccl.so.2 as torch.
RUN NCCL=$(python -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])') \
 && ln -sf libnccl.so.2 "$NCCL/lib/libnccl.so" \
 && HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_MPI=1 HOROVOD_NCCL_HOME="$NCCL" HOROVOD_NCCL_LINK=SHARED \
    /tmp/build/horovod-wheel.sh python /tmp/wheels \
 && pip install /tmp/wheels/horovod-*/horovod-*.whl && rm -rf /tmp/wheels \
 && horovodrun --check-build
COPY nodelib/ /opt/trainflow/nodelib/
COPY trainer/ /opt/trainflow/trainer/
# The rank shim a user's own script runs under (its lines prefixed with the rank); the scripts come mounted.
COPY scriptrun/ /opt/trainflow/scriptrun/
RUN python /opt/trainflow/trainer/jpeg_crop.py /opt/trainflow/lib
WORKDIR /opt/trainflow
# NCCL: warnings only; no InfiniBand unless the nodes have it (Azure ND-series: set NCCL_IB_DISABLE=0);
# keep NCCL off the loopback and Docker bridges. Run with --ipc=host or --shm-size=16g: NCCL and the
# data loaders use /dev/shm.
ENV NCCL_DEBUG=WARN NCCL_SOCKET_IFNAME=^lo,docker0 NCCL_IB_DISABLE=1 \
    TRAINFLOW_TRAINER=/opt/trainflow/trainer/train.py TRAINFLOW_JPEG_CROP_DIR=/opt/trainflow/lib
LABEL org.opencontainers.image.title="trainflow-gpu" org.opencontainers.image.source="containers/gpu.Dockerfile"
CMD ["python", "/opt/trainflow/trainer/train.py", "--help"]
