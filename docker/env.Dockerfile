# syntax=docker/dockerfile:1
# The slim image of the environment service and the trainer: no torch, no GPU libraries.
# Pods run `aflowrl serve env ...` and `aflowrl train ...` (CONTRACTS.md); bubblewrap isolates
# generated code where the kernel allows user namespaces (else the sandbox uses rlimits).
# "tracking" brings the trainer's W&B and MLflow loggers (monitoring.loggers); TensorBoard's event
# files need only "env".
# Build from the repository root:  docker build -f docker/env.Dockerfile -t aflow-rl-env .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[env,tracking]"

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install --yes --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 aflowrl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin aflowrl
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "aflow-rl[env,tracking]"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp AFLOWRL_CACHE_DIR=/cache
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["aflowrl"]
CMD ["--help"]
