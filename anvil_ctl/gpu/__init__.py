"""GPU logic over NVML readings: roles, ownership, VRAM release and reserve gates, waiver policy.

All pure except `release`, which polls a `GpuProbe` through an injected `Clock`; nothing
here imports the adapters.
"""
