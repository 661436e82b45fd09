"""GPU logic over NVML readings, pure except `release` (which polls through an injected `Clock`)."""
