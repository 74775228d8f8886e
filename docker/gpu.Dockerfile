# syntax=docker/dockerfile:1
# The GPU image of the rollout service (vLLM or transformers) and the learner (FSDP2 ranks
# under torchrun). Pods run `aflowrl serve rollout ...` and `torchrun ... -m aflowrl serve
# learner ...` (CONTRACTS.md). The torch and vLLM wheels from PyPI carry their CUDA
# libraries; the node's NVIDIA container toolkit provides the driver.
# Build from the repository root:  docker build -f docker/gpu.Dockerfile -t aflow-rl-gpu .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[learner,rollout,vllm,ray]"

FROM ${PYTHON_IMAGE}
# Triton (vLLM's and torch.compile's kernels) compiles a small C launcher per kernel at run time:
# the image needs a C compiler and libc headers (the Python headers come with the base image).
# rdma-core, the verbs providers (mlx5, efa...) and librdmacm: NCCL's InfiniBand / RoCE transport
# loads libibverbs at run time and, without it, falls back to TCP sockets (resources.rdma).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
    rdma-core libibverbs1 ibverbs-providers librdmacm1 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 aflowrl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin aflowrl
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "aflow-rl[learner,rollout,vllm,ray]"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp AFLOWRL_CACHE_DIR=/cache \
    HF_HOME=/cache/huggingface HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TRITON_CACHE_DIR=/tmp/triton VLLM_CACHE_ROOT=/tmp/vllm \
    RAY_TMPDIR=/tmp/ray
USER 10001:10001
# gRPC (rollout, learner), torchrun's rendezvous, metrics, a multi-node group's meeting port
EXPOSE 50052 50053 29500 9090 29610
ENTRYPOINT ["aflowrl"]
CMD ["--help"]
