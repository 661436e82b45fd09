"""Recipes: pinned, validated descriptions of one serve, and the container spec `load` creates.

A recipe is a TOML file whose name (without `.toml`) is its `name`. It pins the model
(`repo@<40-hex revision>`) and the image (repo digest or local image ID; a tag is refused).
Values its sources do not give are never invented: they stay absent and are listed in
`unknown` (such a recipe validates and plans but is not runnable); values we chose are
listed in `assumed`.

Warning: the recipe digest covers the file's content, not its location; relative mount
sources resolve against the recipe's directory only when a spec is made.
"""
