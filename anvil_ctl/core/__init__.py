"""The pure core: states, transitions, steps, guards, ports, snapshots and errors.

Nothing in this package performs I/O or imports docker, httpx, pynvml or
sqlalchemy; `tests/unit/test_core_imports.py` enforces that.
"""
