"""The wheel carries the alembic migrations and the shipped recipes as package data.

They stay at the repository's top level (`migrations/`, `recipes/`), their documented
places and the source of truth; building the package copies them into
`anvil_ctl/_shipped/` of the build, where `anvil_ctl.places` finds them in an
installed wheel. An editable install copies nothing: there `anvil_ctl.places`
finds the repository's own folders. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = {
    # folder at the repository root: the files of it a wheel carries
    "migrations": ("env.py", "script.py.mako", "versions/*.py"),
    "recipes": ("*.toml",),
}


class BuildWithShippedData(build_py):
    """build_py, plus the top-level data folders copied into anvil_ctl/_shipped/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's folders in place
        for folder, patterns in SHIPPED.items():
            target = Path(self.build_lib) / "anvil_ctl" / "_shipped" / folder
            shutil.rmtree(target, ignore_errors=True)
            for pattern in patterns:
                for source in sorted((ROOT / folder).glob(pattern)):
                    dest = target / source.relative_to(ROOT / folder)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildWithShippedData})
