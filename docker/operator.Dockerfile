# syntax=docker/dockerfile:1
# The aflow-rl operator (kopf): `aflowrl-operator`, run by the Helm chart's Deployment and its
# hooks (`--install-crd` before an upgrade, `--check` for `helm test`).
# Build from the repository root:  docker build -f docker/operator.Dockerfile -t aflow-rl-operator .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 aflowrl \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin aflowrl
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "aflow-rl[operator]"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["aflowrl-operator"]
