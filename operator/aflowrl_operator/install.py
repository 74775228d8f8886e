"""Installation tasks run from the operator's image by the Helm chart's hooks.

:func:`install_crd` is the pre-upgrade hook: ``helm upgrade`` never touches ``crds/``, so a new
operator would otherwise meet the old CRD (old schema, no CEL rules for new fields). It
server-side applies the CRD this operator was built with (:func:`aflowrl.config.crd
.training_run_crd`) under its own field manager and waits until the API server reports it
``Established``. :func:`check` is the ``helm test``: the CRD is established and is this
operator's, and the operator Deployment has a ready pod.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aflowrl.config.crd import training_run_crd
from aflowrl_operator.errors import ApiRejectedError, ApiUnavailableError
from aflowrl_operator.kube import KubeApi, load_configuration

JsonDict = dict[str, Any]

CRD_MANAGER = "aflowrl-crd-installer"
"""Field manager of the CRD's fields (``kubectl apply --server-side`` users may share them)."""


def _established(crd: JsonDict | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _same_schema(crd: JsonDict | None) -> bool:
    wanted = training_run_crd()["spec"]["versions"]
    served = ((crd or {}).get("spec") or {}).get("versions") or []
    schema = [v.get("schema") for v in served]
    return json.dumps(schema, sort_keys=True) == json.dumps(
        [v.get("schema") for v in wanted], sort_keys=True
    )


async def install_crd(*, api: KubeApi | None = None, timeout_s: float = 60.0) -> tuple[bool, str]:
    """Apply the TrainingRun CRD and wait until it is established: (ok, message)."""
    api = api or KubeApi(load_configuration())
    crd = training_run_crd()
    name = crd["metadata"]["name"]
    try:
        await api.apply(crd, field_manager=CRD_MANAGER, force=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            live = await api.get("CustomResourceDefinition", None, name)
            if _established(live):
                return True, f"CustomResourceDefinition {name} applied and established"
            if loop.time() > deadline:
                return (
                    False,
                    f"CustomResourceDefinition {name} is not established after {timeout_s:.0f} s",
                )
            await asyncio.sleep(1.0)
    except (ApiRejectedError, ApiUnavailableError) as exc:
        return False, f"cannot apply CustomResourceDefinition {name}: {exc}"


async def check(target: str, *, api: KubeApi | None = None) -> tuple[bool, str]:
    """Whether the CRD is established and current and ``NAMESPACE/DEPLOYMENT`` is ready."""
    namespace, _, deployment = target.partition("/")
    if not namespace or not deployment:
        return False, f"--check wants NAMESPACE/DEPLOYMENT, got {target!r}"
    api = api or KubeApi(load_configuration())
    name = training_run_crd()["metadata"]["name"]
    try:
        crd = await api.get("CustomResourceDefinition", None, name)
        operator = await api.get("Deployment", namespace, deployment)
    except (ApiRejectedError, ApiUnavailableError) as exc:
        return False, f"cannot read the installation: {exc}"
    problems = []
    if not _established(crd):
        problems.append(f"CustomResourceDefinition {name} is missing or not established")
    elif not _same_schema(crd):
        problems.append(
            f"CustomResourceDefinition {name} is not this operator's (upgrade it: README, "
            "'Upgrading the CRD')"
        )
    ready = ((operator or {}).get("status") or {}).get("readyReplicas") or 0
    if ready < 1:
        problems.append(f"Deployment {target} has no ready operator pod")
    if problems:
        return False, "; ".join(problems)
    return True, f"CRD {name} established and current; {target} has {ready} ready pod(s)"
