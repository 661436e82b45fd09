"""GPU logic over NVML readings, pure except the VRAM-release gate (which polls through an injected `Clock`)."""
