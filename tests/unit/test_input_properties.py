"""Property tests of the loaders of what a person hands us: host configs, recipes, credential
files and evidence manifests.

Every generated input either loads or raises the project's own error for that input
(ConfigError, RecipeError, CredentialError, BadInput), never anything else: no
UnicodeDecodeError, RecursionError, OverflowError, TypeError or KeyError reaches the
command line. Inputs are arbitrary bytes, text in other encodings, arbitrary TOML or JSON
documents (huge integers, inf and nan, control characters, dates, deep nesting) and
valid documents with a few values replaced.

`ANVIL_PROPERTY_EXAMPLES` sets the number of examples per test (default 200; the
closing note's measurement used 4,000).
"""

from __future__ import annotations

import copy
import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from anvil_ctl.adapters.credentials import Secret, read_credential_file, resolve_token
from anvil_ctl.config.host import HostConfig, load_host_config
from anvil_ctl.core.errors import BadInput, ConfigError, CredentialError, RecipeError
from anvil_ctl.evidence.bundle import read_manifest, verify_bundle
from anvil_ctl.recipes.model import Recipe, load_recipe
from tests.unit.badinput_cases import BASE_RECIPE, HOST

EXAMPLES = int(os.environ.get("ANVIL_PROPERTY_EXAMPLES", "200"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis directory in the work tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- strategies --------------------------------------------------------------------------------

keys = st.text(min_size=1, max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.booleans(),
    st.datetimes(),
    st.dates(),
    st.times(),
)
toml_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=24,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=24,
)


def leaf_paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in `data` (tables, lists and their members)."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out += leaf_paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += leaf_paths(v, (*prefix, i))
    return out


@st.composite
def edited(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """`base` with one to three values replaced, removed or added."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = leaf_paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(keys)] = draw(toml_values)
        else:
            parent[path[-1]] = draw(toml_values)
    return data


def dumps(data: Any) -> str:
    try:
        return tomlkit.dumps(data)
    except Exception:  # tomlkit cannot write it (a key or value TOML has no form for)
        assume(False)
        raise


def toml_inputs(base: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Bytes of a file that claims to be TOML: anything from noise to a near-valid document."""
    return st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300).map(lambda t: t.encode()),
        st.text(max_size=100).map(lambda t: t.encode("utf-16")),
        st.dictionaries(keys, toml_values, max_size=6).map(lambda d: dumps(d).encode()),
        edited(base).map(lambda d: dumps(d).encode()),
        st.integers(1, 3000).map(lambda n: ("a = " + "[" * n + "]" * n).encode()),
    )


def write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("properties")


# -- the loaders -------------------------------------------------------------------------------


class TestHostConfigLoader:
    @PROPERTY
    @given(data=toml_inputs(tomllib.loads(HOST)))
    def test_loads_or_raises_config_error(self, work: Path, data: bytes) -> None:
        path = write(work / "anvil.toml", data)
        try:
            assert isinstance(load_host_config(path), HostConfig)
        except ConfigError as exc:
            assert str(path) in str(exc)


class TestRecipeLoader:
    @PROPERTY
    @given(data=toml_inputs(tomllib.loads(BASE_RECIPE)))
    def test_loads_or_raises_recipe_error(self, work: Path, data: bytes) -> None:
        path = write(work / "stub-245k-c1.toml", data)
        try:
            assert isinstance(load_recipe(path), Recipe)
        except RecipeError as exc:
            assert str(path) in str(exc)


class TestCredentialLoader:
    @PROPERTY
    @given(data=toml_inputs({"admin_token": "a" * 20, "client_token": "c" * 20}))
    def test_a_file_loads_or_raises_credential_error_naming_no_value(self, work: Path, data: bytes) -> None:
        path = write(work / "router.toml", data)
        try:
            tokens = read_credential_file(path)
        except CredentialError as exc:
            assert str(path) in str(exc)
            return
        for token in tokens.values():
            assert token.isascii() and token.isprintable() and " " not in token

    @PROPERTY
    @given(value=st.text(max_size=60))
    def test_an_environment_token_resolves_or_raises_credential_error(self, value: str) -> None:
        try:
            secret = resolve_token("client", "TOKEN", {"TOKEN": value}, None)
        except CredentialError as exc:
            assert not value.strip() or value.strip() not in str(exc)
            return
        assert isinstance(secret, Secret) and secret.reveal() == value.strip()


class TestManifestLoader:
    @PROPERTY
    @given(
        data=st.one_of(
            st.binary(max_size=300),
            json_values.map(lambda v: json.dumps(v).encode()),
            json_values.map(lambda v: json.dumps({"artifacts": v}).encode()),
            st.lists(
                st.fixed_dictionaries(
                    {"path": st.text(max_size=20), "sha256": st.text(max_size=70), "size": json_values}
                ),
                max_size=3,
            ).map(lambda a: json.dumps({"artifacts": a}).encode()),
        )
    )
    def test_reads_or_raises_bad_input_and_verify_never_raises(self, work: Path, data: bytes) -> None:
        bundle = work / "bundle"
        bundle.mkdir(exist_ok=True)
        write(bundle / "manifest.json", data, 0o644)
        try:
            manifest = read_manifest(bundle)
        except BadInput:
            manifest = None
        if manifest is not None:
            assert len(manifest[1]) == len(manifest[0]["artifacts"])
        result = verify_bundle(bundle)
        assert result.ok is (manifest is not None and not result.mismatches)
