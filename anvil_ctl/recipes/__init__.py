"""Recipes: pinned, validated descriptions of one serve, and the container spec `load` creates."""
