"""`scripts/testenv up` from inside another mount namespace, made on either CPU.

Linux 6.18 numbers namespaces from per-CPU batches: a namespace made later on one CPU can carry
a lower number than an earlier one made on another, and the kernel then refuses to bind the
newer namespace's file from inside the older one (EINVAL, its loop check). The env used to keep
its mount namespace as such a bind (`unshare --mount=FILE`), so an env `up` from inside another
(the fleet test's second host) failed whenever the two were made on CPUs in the wrong order.
Here both orders are forced with `taskset`: a private mount namespace made on one CPU (as the
outer env's is), and `up` run inside it on the other. Each env must come up, have a /dev/shm
of its own and a dockerd that answers, and go down leaving nothing: its directory, its netns
and the process holding its mount namespace gone.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.second_env import TESTENV

pytestmark = pytest.mark.integration

CPUS = sorted(os.sched_getaffinity(0))


def _bind_refused(outer_cpu: int, inner_cpu: int, tmp: Path) -> bool:
    """Whether this kernel refuses the old way (a namespace file bound from a nested namespace)."""
    script = (
        'set -e; mkdir -p "$1"; mount --bind "$1" "$1"; mount --make-private "$1"; touch "$1/mnt"; '
        'rc=0; taskset -c "$2" unshare --mount="$1/mnt" --propagation private true 2>/dev/null || rc=$?; '
        'umount -l "$1"; exit "$rc"'
    )
    r = subprocess.run(
        ["taskset", "-c", str(outer_cpu), "unshare", "-m", "--propagation", "private",
         "bash", "-c", script, "bash", str(tmp / f"ns-{outer_cpu}-{inner_cpu}"), str(inner_cpu)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return r.returncode != 0


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to make the namespaces on different ones")
@pytest.mark.parametrize(("outer_cpu", "inner_cpu"), [(CPUS[0], CPUS[-1]), (CPUS[-1], CPUS[0])])
def test_an_env_comes_up_and_goes_down_inside_a_namespace_made_on_another_cpu(
    outer_cpu: int, inner_cpu: int, tmp_path: Path
) -> None:
    refused = _bind_refused(outer_cpu, inner_cpu, tmp_path)
    mark = f"anvil-it-outer-{uuid.uuid4().hex[:8]}"
    env = os.environ | {"ANVIL_TESTENV_POSTGRES": "0", "ANVIL_TESTENV_LLAMA": "0"}
    # up, a look inside and down, all from the namespace made on outer_cpu (`ip netns add`
    # binds the netns file there, where it is private); up itself on inner_cpu
    script = (
        'set -u; root=$(taskset -c "$1" "$2" up) || exit 11; echo "root $root"; '
        'echo "holder $(cat "$root/mnt.pid")"; echo "netns $(cat "$root/netns")"; '
        '"$2" exec "$root" -- sh -c "ls -A /dev/shm; docker version --format \'server {{.Server.Version}}\'" '
        "|| exit 12; "
        '"$2" down "$root" || exit 13; echo down'
    )
    (Path("/dev/shm") / mark).write_bytes(b"outer")
    try:
        r = subprocess.run(
            ["taskset", "-c", str(outer_cpu), "unshare", "-m", "--propagation", "private",
             "bash", "-c", script, "bash", str(inner_cpu), str(TESTENV)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        (Path("/dev/shm") / mark).unlink(missing_ok=True)
    said = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert r.returncode == 0, (
        f"exited {r.returncode} (11 up, 12 exec, 13 down; this kernel refuses the old namespace "
        f"bind here: {refused})\n{r.stdout}\n{r.stderr}"
    )
    assert mark not in r.stdout  # the env's /dev/shm is its own
    assert "server" in said  # its dockerd answered
    assert r.stdout.splitlines()[-1] == "down"
    assert not Path(said["root"]).exists()
    assert not Path(f"/var/run/netns/{said['netns']}").exists()
    holder = Path(f"/proc/{said['holder']}/cmdline")
    assert not holder.exists() or b"sleep" not in holder.read_bytes()  # the namespace's holder is gone
