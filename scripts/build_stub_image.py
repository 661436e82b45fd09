#!/usr/bin/env python3
"""Build the stub engine's image deterministically, in `docker save` format.

The image holds one minimal layer: the mount-point directories the stub
containers need (`/usr`, `/lib`, `/lib64` and `/opt/anvil/anvil_stub` are
bind-mounted from the host at run time) and nothing else. Every byte is fixed
(timestamps, owners, modes, member order, JSON layout), so the image ID — the
SHA-256 of the config JSON — is the same on every machine and recipes can pin it.

    build_stub_image.py --print-id          # the ID, computed without Docker
    build_stub_image.py --out stub.tar      # a tarball for `docker load`
    build_stub_image.py --load              # load into $DOCKER_HOST and verify the ID

Standard library only, except `--load`, which uses the docker SDK when it is
importable and the `docker` CLI otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

TAG_REPO, TAG_NAME = "anvil-stub", "local"
TAG = f"{TAG_REPO}:{TAG_NAME}"
EPOCH = 1704067200  # 2024-01-01T00:00:00Z, the fixed mtime of every member
CREATED = "2024-01-01T00:00:00Z"

# (path, kind, mode, payload): kind "dir", "file" or "symlink"
_ROOTFS: tuple[tuple[str, str, int, str], ...] = (
    ("bin", "symlink", 0o777, "usr/bin"),
    ("dev", "dir", 0o755, ""),
    ("etc", "dir", 0o755, ""),
    ("etc/group", "file", 0o644, "root:x:0:\nnogroup:x:65534:\n"),
    (
        "etc/passwd",
        "file",
        0o644,
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
    ),
    ("lib", "dir", 0o755, ""),
    ("lib64", "dir", 0o755, ""),
    ("opt", "dir", 0o755, ""),
    ("opt/anvil", "dir", 0o755, ""),
    ("opt/anvil/anvil_ctl", "dir", 0o755, ""),
    ("opt/anvil/anvil_stub", "dir", 0o755, ""),
    ("proc", "dir", 0o755, ""),
    ("root", "dir", 0o700, ""),
    # a real directory (not a link into the read-only /usr) so that Docker can
    # mount its init (docker-init) at /sbin/docker-init for init=True
    ("sbin", "dir", 0o755, ""),
    ("sys", "dir", 0o755, ""),
    ("tmp", "dir", 0o1777, ""),
    ("usr", "dir", 0o755, ""),
    ("var", "dir", 0o755, ""),
    ("var/tmp", "dir", 0o1777, ""),
)


def _tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name: str, kind: str, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode = mode
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.size = size
    info.linkname = linkname
    return info


def layer_tar() -> bytes:
    """The one layer: mount points and two tiny account files, byte-for-byte fixed."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for path, kind, mode, payload in _ROOTFS:
        if kind == "dir":
            members.append((_info(path + "/", kind, mode), None))
        elif kind == "symlink":
            members.append((_info(path, kind, mode, linkname=payload), None))
        else:
            data = payload.encode()
            members.append((_info(path, kind, mode, size=len(data)), data))
    return _tar_bytes(members)


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def image_config(diff_id: str) -> bytes:
    """The image config JSON; its SHA-256 is the image ID.

    No Cmd, Entrypoint or Env: a container's inspected config then equals exactly
    what its creator asked for, which keeps config fingerprints comparable.
    """
    return _canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": CREATED,
            "config": {
                "Labels": {"io.anvil.image": "stub", "io.anvil.image-format": "1"},
                "WorkingDir": "/",
            },
            "history": [{"created": CREATED, "created_by": "anvil_ctl scripts/build_stub_image.py"}],
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    )


def build() -> tuple[str, bytes]:
    """Return (image ID, `docker save`-format tarball bytes)."""
    layer = layer_tar()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = image_config(diff_id)
    image_hex = hashlib.sha256(config).hexdigest()
    layer_dir = hashlib.sha256(diff_id.encode()).hexdigest()  # the v1 layer ID, any fixed hex
    manifest = [{"Config": f"{image_hex}.json", "RepoTags": [TAG], "Layers": [f"{layer_dir}/layer.tar"]}]
    layer_json = _canonical({"id": layer_dir, "created": CREATED, "os": "linux"})
    files: list[tuple[str, bytes | None]] = [
        (f"{image_hex}.json", config),
        (f"{layer_dir}/", None),
        (f"{layer_dir}/VERSION", b"1.0"),
        (f"{layer_dir}/json", layer_json),
        (f"{layer_dir}/layer.tar", layer),
        ("manifest.json", _canonical(manifest)),
        ("repositories", _canonical({TAG_REPO: {TAG_NAME: layer_dir}})),
    ]
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for name, data in files:
        if data is None:
            members.append((_info(name, "dir", 0o755), None))
        else:
            members.append((_info(name, "file", 0o644, size=len(data)), data))
    return "sha256:" + image_hex, _tar_bytes(members)


def load(tarball: bytes, expected_id: str) -> str:
    """Load the tarball into the engine at $DOCKER_HOST; return the loaded ID or exit 1."""
    try:
        import docker

        client = docker.from_env()
        try:
            images = client.images.load(tarball)
            loaded = images[0].id if images else ""
        finally:
            client.close()
    except ImportError:
        with tempfile.NamedTemporaryFile(suffix=".tar") as tmp:
            tmp.write(tarball)
            tmp.flush()
            subprocess.run(["docker", "load", "-i", tmp.name], check=True, capture_output=True)
        out = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", TAG],
            check=True,
            capture_output=True,
            text=True,
        )
        loaded = out.stdout.strip()
    if loaded != expected_id:
        print(f"loaded image ID {loaded!r} differs from computed {expected_id}", file=sys.stderr)
        raise SystemExit(1)
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--print-id", action="store_true", help="print the image ID (no Docker needed)")
    parser.add_argument("--out", type=Path, help="write the docker-save tarball here")
    parser.add_argument("--load", action="store_true", help="docker load it ($DOCKER_HOST) and verify the ID")
    args = parser.parse_args(argv)
    if not (args.print_id or args.out or args.load):
        parser.error("give at least one of --print-id, --out, --load")
    image_id, tarball = build()
    if args.out:
        args.out.write_bytes(tarball)
    if args.load:
        load(tarball, image_id)
    if args.print_id or args.load:
        print(image_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
