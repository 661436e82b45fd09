"""GPU logic over NVML readings, pure except the VRAM-release gate (it polls through a `Clock`)."""
