"""The pure core: no I/O, no docker, httpx, pynvml or sqlalchemy, no other layer
(`tests/unit/test_layers.py` enforces it)."""
