"""The simulated host the Docker integration tests share: two 97,887 MiB cards (the seeds'
RTX PRO 6000 pair), slot `primary` on 127.0.0.1:8001, no router, short timeouts."""

from __future__ import annotations

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
