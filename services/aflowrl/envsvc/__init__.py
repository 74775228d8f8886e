"""The environment service (gRPC): AFlow's workflow search as a stateless RL environment.

``aflowrl serve env`` serves ``EnvironmentService`` (protos/aflowrl/v1/environment.proto) over
the search's episode state machine (:mod:`aflowrl.search`):

* :mod:`.server`: spec checks, warm-up (data, executor, cache, sandbox pool), the gRPC server;
* :mod:`.service`: the gRPC adapter (protos in, domain calls, protos out);
* :mod:`.environment`: the replica's domain object (reset, step, project, evaluate, info);
* :mod:`.blob`: the opaque, versioned, size-limited, integrity-checked state blob;
* :mod:`.executors`: the executor from the spec (surrogate in-process, or OpenAI-compatible);
* :mod:`.metrics`: the Prometheus catalogue (``EnvironmentMetrics``);
* :mod:`.errors`: request, state and setup errors.

No episode state lives on a server: the caller carries the blob, so any replica serves any call
and a retried call gives the same result. The trainer routes Steps by the child workflow's hash
(``Project`` first) so that replicas' evaluation caches are shared by the trajectories of a
group. With ``fused`` selection the caller sends V(s) with every Reset and Step
(``StateValues``).
"""

from aflowrl.envsvc.blob import StateCodec
from aflowrl.envsvc.environment import Environment
from aflowrl.envsvc.metrics import EnvironmentMetrics

__all__ = ["Environment", "EnvironmentMetrics", "StateCodec"]
