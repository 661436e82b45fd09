"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml).

Both are built once at the edge and passed in; no library module reads the environment.
Errors name the file, the key and what was expected.
"""
