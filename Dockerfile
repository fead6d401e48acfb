# One image for the API, the migrate step and the workers.
# GPU workers: the default torch wheel from PyPI carries CUDA. For a CPU-only image build with
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu .
FROM python:3.11-slim
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# bubblewrap: the job sandbox (setpriv and prlimit come with util-linux). docs/security.md
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
RUN if [ -n "$TORCH_INDEX" ]; then pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX"; \
    else pip install "torch==${TORCH_VERSION}"; fi
COPY pyproject.toml README.md alembic.ini ./
COPY sdk sdk
COPY control control
COPY server server
COPY workers workers
COPY migrations migrations
# .[worker]: the API (server), the training engine and the extras jobs use, streaming (pyarrow,
# zstandard, torchdata: sharded datasets) among them; the API reads parquet footers with pyarrow.
RUN pip install -e '.[worker]'
ENV ACE3_MIGRATIONS_DIR=/app/migrations
CMD ["ace3", "server", "--host", "0.0.0.0", "--port", "8000"]
