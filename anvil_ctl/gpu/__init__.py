"""GPU logic over NVML readings: roles, ownership, VRAM release and reserve gates, waivers.

Modules: `naming` (role order and names), `roles` (host-config roles and their
TOML), `ownership` (who may start on which roles), `release` (wait for VRAM to
be freed), `reserve` (the reserve policy gate), `waivers` (attributed policy
exceptions and reclassified decisions). All pure except `release`, which polls
a `GpuProbe` through an injected `Clock`. This package imports nothing from
the adapters; `naming`, `reserve` and `ownership` need no pydantic.
"""
