# MLPerf BERT pre-training (PyTorch) on NVIDIA GPUs.
#   docker build -t mlperf-bert .
#   docker run --gpus all --ipc=host -v /data/bert:/data:ro -v "$PWD/out":/output \
#     -e DATA_DIR=/data/tfrecords -e INIT_CHECKPOINT=/data/phase1/model.ckpt-28252 mlperf-bert
# Without DATA_DIR the container runs the built-in CPU demo.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHON=/opt/venv/bin/python \
    OUTPUT_DIR=/output \
    MLPERF_BERT_CACHE=/opt/cache

# The distribution's Python 3.12 (the image's security updates decide the patch level).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /workspace/bert

# Same pins as .venv; torch==2.13.0 from PyPI is the CUDA build on linux x86_64.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

# The package runs from WORKDIR (python -m mlperf_bert, run_pretraining.py); the optional C
# extension of the data generator is not needed for training and needs no compiler here.
COPY . .

CMD ["./start_training.sh"]
