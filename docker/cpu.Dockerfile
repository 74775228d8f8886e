# syntax=docker/dockerfile:1
# The CPU image of the rollout service (transformers) and the learner (FSDP2 ranks on gloo), for
# rollout and learner pods that request no GPU (the tiny-cpu example, kind, a laptop): the CPU
# build of torch, no CUDA libraries, no vLLM. Pods run `aflowrl serve rollout ...` and
# `torchrun ... -m aflowrl serve learner ...` (CONTRACTS.md), as with the GPU image.
# Build from the repository root:  docker build -f docker/cpu.Dockerfile -t aflow-rl-cpu .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY operator ./operator
# torch from the CPU index (its wheels carry no CUDA libraries), everything else from PyPI.
RUN pip wheel --no-cache-dir --wheel-dir /wheels --extra-index-url "${TORCH_INDEX}" \
    ".[learner,rollout]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 aflowrl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin aflowrl
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "aflow-rl[learner,rollout]"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp AFLOWRL_CACHE_DIR=/cache \
    HF_HOME=/cache/huggingface HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
USER 10001:10001
# gRPC (rollout, learner), torchrun's rendezvous, metrics
EXPOSE 50052 50053 29500 9090
ENTRYPOINT ["aflowrl"]
CMD ["--help"]
