"""Plumbing shared by the aflow-rl services: gRPC server and client, interceptors, metrics, logs.

- :mod:`aflowrl.common.server`: ``GrpcServer`` (health, reflection, graceful stop, /metrics);
- :mod:`aflowrl.common.client`: ``make_channel`` (deadlines, retries of idempotent calls,
  round-robin), ``wait_until_serving``;
- :mod:`aflowrl.common.keepalive`: the ping policy clients and servers share (``KEEPALIVE``);
- :mod:`aflowrl.common.tls`: certificates of TLS and mutual TLS, for servers and clients;
- :mod:`aflowrl.common.interceptors`: request ids, auth, the standard gRPC metrics, error mapping;
- :mod:`aflowrl.common.metrics`: ``ComponentMetrics``, ``GrpcServerMetrics``, process metrics
  and the ``/metrics`` HTTP server;
- :mod:`aflowrl.common.logging`: ``setup_logging`` (text or JSON lines).
"""

__all__ = ["client", "interceptors", "keepalive", "logging", "metrics", "server", "tls"]
