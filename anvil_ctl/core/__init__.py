"""The pure core: states, transitions, steps, guards, ports, snapshots, waivers and errors.

Nothing in this package performs I/O or imports docker, httpx, pynvml or
sqlalchemy, nor any other layer of anvil_ctl; `tests/unit/test_layers.py`
enforces that.
"""
