"""Recipes: pinned, validated descriptions of one serve, and the container spec `load` creates.

A recipe is a TOML file in `recipes/` whose file name (without `.toml`) is its
`name`. It pins the model (`repo@<40-hex revision>`) and the image (repo digest
or local image ID; a tag is refused), and names everything the container needs.
Values the sources of a recipe do not give are never invented: they stay absent
and are listed in `unknown`; values we chose ourselves are listed in `assumed`.
A recipe with any `unknown` entry validates and plans but is not runnable.

Warning: the recipe digest covers the file's content, not its location; relative
mount sources resolve against the recipe's directory only when a spec is made.

Modules: `model` (the recipe, its loading and digest) and `spec` (the container spec
and the checks before it).
"""
