"""The simulated host the Docker integration tests share: two 97,887 MiB cards (the seeds'
RTX PRO 6000 pair), slot `primary` on 127.0.0.1:8001, no router, short timeouts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import anvil_stub
from anvil_ctl.core.model import LABEL_MANAGED, ContainerSpec, Mount

INCUMBENT = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"
GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"
GPU_B = "GPU-00000000-0000-4000-8000-00000000000b"


def sim_host_toml(gpu_a: str = GPU_A, gpu_b: str = GPU_B, *, extra: str = "") -> str:
    """anvil.toml for the tests; `extra` adds tables (another slot, say) before [router]."""
    return f"""
[gpu_roles.compute-a]
uuid = "{gpu_a}"
capacity_mib = 97887
[gpu_roles.compute-b]
uuid = "{gpu_b}"
capacity_mib = 97887
[slots.primary]
binding = "127.0.0.1:8001"
router_tier = "primary-local"
aliases = ["llm.primary"]
gpu_roles = ["compute-a", "compute-b"]
{extra}
[router]
kind = "none"
[policy]
stop_timeout_s = 5
vram_release_deadline_s = 10
health_poll_s = 0.1
"""


def stub_container_spec(
    image: str,
    *,
    name: str,
    port: int,
    served_model: str,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    gpu_uuids: Sequence[str] = (),
) -> ContainerSpec:
    """One stub engine container as docs/CONTRACTS.md specifies it: the host's `/usr`, `/lib`,
    `/lib64` and the repo's `anvil_stub` bind-mounted read-only, `PYTHONPATH=/opt/anvil`,
    host networking, `init=True`; labels default to io.anvil.managed=true."""
    command = ("/usr/bin/python3", "-m", "anvil_stub", "--host", "127.0.0.1", "--port", str(port))
    return ContainerSpec(
        name=name,
        image=image,
        command=(*command, "--served-model", served_model, *extra_args),
        env=tuple({"PYTHONPATH": "/opt/anvil", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}.items()),
        labels=tuple(sorted({LABEL_MANAGED: "true", **(labels or {})}.items())),
        mounts=(
            Mount("/usr", "/usr"),
            Mount("/lib", "/lib"),
            Mount("/lib64", "/lib64"),
            Mount(str(Path(anvil_stub.__file__).parent), "/opt/anvil/anvil_stub"),
        ),
        network_mode="host",
        gpu_uuids=tuple(gpu_uuids),
        init=True,
    )
