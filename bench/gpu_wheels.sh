#!/usr/bin/env bash
# Fetch into .whl/ the wheels gpufleet needs that the device machine's image lacks (its python3
# is 3.12 with torch, typer, rich, psutil, pyyaml, nvidia-ml-py, prometheus-client, fsspec and
# httpx already there; see the device tool's KINDS.md), for bench/gpu_check.sh to install.
# Run it here, once, before sending a check with `.whl` in carry. .whl/ is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  plat+=(--platform "$p")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .whl "pydantic>=2.7,<3" pydantic-core annotated-types typing-inspection \
  "sqlalchemy>=2.0,<3" greenlet fastapi starlette uvicorn typing-extensions opentelemetry-api
ls .whl
