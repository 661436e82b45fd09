"""Host side: the ContainerSpec that runs the stub engine in a container of the stub image.

Not imported by the stub server (which is stdlib only and runs in the container);
used by tests, recipes and `make demo` to build the exact spec of docs/CONTRACTS.md:
host `/usr`, `/lib`, `/lib64` and the repo's `anvil_ctl/stub` bind-mounted
read-only, `PYTHONPATH=/opt/anvil`, host networking, `init=True`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from anvil_ctl.core.model import LABEL_MANAGED, ContainerSpec, Mount

STUB_DIR = Path(__file__).resolve().parent
CONTAINER_STUB_DIR = "/opt/anvil/anvil_ctl/stub"
PYTHON = "/usr/bin/python3"


def stub_command(
    *, port: int, served_model: str, extra_args: Sequence[str] = (), host: str = "127.0.0.1"
) -> tuple[str, ...]:
    return (
        PYTHON,
        "-m",
        "anvil_ctl.stub",
        "--host",
        host,
        "--port",
        str(port),
        "--served-model",
        served_model,
        *extra_args,
    )


def stub_container_spec(
    image: str,
    *,
    name: str,
    port: int,
    served_model: str,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    gpu_uuids: Sequence[str] = (),
    stub_dir: Path = STUB_DIR,
) -> ContainerSpec:
    """The spec of one stub container; labels default to io.anvil.managed=true."""
    all_env = {"PYTHONPATH": "/opt/anvil", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    all_labels = {LABEL_MANAGED: "true", **(labels or {})}
    return ContainerSpec(
        name=name,
        image=image,
        command=stub_command(port=port, served_model=served_model, extra_args=extra_args),
        env=tuple(all_env.items()),
        labels=tuple(sorted(all_labels.items())),
        mounts=(
            Mount("/usr", "/usr"),
            Mount("/lib", "/lib"),
            Mount("/lib64", "/lib64"),
            Mount(str(stub_dir), CONTAINER_STUB_DIR),
        ),
        network_mode="host",
        gpu_uuids=tuple(gpu_uuids),
        init=True,
    )
