"""Field types of the settings and the host config, each bounded and checked."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from anvil_ctl.core.validate import MAX_DURATION_S, MAX_MIB, check_text, check_url, describe_char, unsafe_char

GPU_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\Z")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
STATE_DB_RE = re.compile(r"^(sqlite|postgresql)(\+[a-z0-9_]+)?://")


def text_field(max_len: int, *, multiline: bool = False, empty: bool = True) -> AfterValidator:
    return AfterValidator(lambda v: check_text(v, max_len=max_len, multiline=multiline, empty=empty))


def path_text(value: object) -> object:
    """A path as given: no NUL or control characters (they cannot name a file we mean)."""
    if isinstance(value, str | Path):
        text = str(value)
        if not text:
            raise ValueError("expected a path, not an empty string")
        bad = unsafe_char(text)
        if bad is not None:
            raise ValueError(f"contains {describe_char(bad)}; expected a path")
        if len(text) > 4096:
            raise ValueError("expected a path of at most 4096 characters")
    return value


def valid_if(ok: Callable[[str], object], expected: str) -> AfterValidator:
    """A text field's check: its value where `ok(value)` is true, else ValueError(`expected`)."""

    def check(value: str) -> str:
        if not ok(value):
            raise ValueError(expected)
        return value

    return AfterValidator(check)


def url_field(*schemes: str) -> AfterValidator:
    return AfterValidator(lambda v: check_url(v, schemes=schemes))


Label = Annotated[str, text_field(253)]
"""A one-line name or label from a file: host name, product name, alias, tier."""
FilePath = Annotated[Path, BeforeValidator(path_text)]
Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]
MiB = Annotated[int, Field(ge=0, le=MAX_MIB)]
HttpUrl = Annotated[str, url_field("http", "https")]
EnvName = Annotated[
    str, valid_if(ENV_NAME_RE.match, "expected an environment variable name (letters, digits, '_')")
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
