"""Implementations of the core ports at the edge: Docker, routers, NVML, HTTP engines, caches."""
