# Ascendra's container image: the daemon on CPU torch with the built-in tiny model, ready
# to run anywhere (`docker run -p 8000:8000 ascendra:cpu`).
#
#   docker build -t ascendra:cpu .
#
# CUDA variant: the same file with PyPI's torch wheel, which carries its CUDA libraries
# (the host needs the NVIDIA driver and container toolkit; run with --gpus all):
#
#   docker build --build-arg TORCH_INDEX=https://pypi.org/simple -t ascendra:cuda .
#   docker run --gpus all -p 8000:8000 -v /srv/models:/models ascendra:cuda \
#       serve --host 0.0.0.0 --port 8000 --model /models/Meta-Llama-3-8B-Instruct \
#       --layout 2L1H --gpus 0,1,2
#
# Kubernetes manifests using it: deploy/ (README.md, "Running many boxes").
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    ASCENDRA_CACHE=/var/cache/ascendra

RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

WORKDIR /opt/ascendra
COPY setup.cfg pyproject.toml README.md ./
COPY policies/ policies/
COPY ipc/ ipc/
COPY engines/ engines/
COPY daemon/ daemon/
COPY bench/ bench/
RUN pip install . \
    && ascendra make-tiny-model /opt/ascendra/models/tiny-llama \
    && useradd --system --home-dir /var/cache/ascendra --create-home ascendra

USER ascendra
EXPOSE 8000
ENTRYPOINT ["ascendra"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--model", "/opt/ascendra/models/tiny-llama", "--served-model-name", "tiny-llama", "--device", "cpu"]
