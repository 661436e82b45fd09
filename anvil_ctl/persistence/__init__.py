"""The state database: every SQL query and write of anvil_ctl lives in this package.

Callers get and give our own values (dataclasses, `Identity`, `Waiver`, JSON-able dicts),
never a session or an ORM row. `store` is the entry; the other modules hold one concept each.
"""
