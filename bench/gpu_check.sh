#!/usr/bin/env bash
# The GPU path in one short run, for a machine with NVIDIA GPUs (the `device` tool's machine,
# or any other): the example GPT on NCCL (the demo's job), `doctor`, `bench allreduce`, an FSDP
# bf16 job whose measured peak CUDA memory (`cuda_max_allocated_bytes`) is compared with
# `gpufleet plan`'s memory for the same model and layout, the NVML telemetry the supervisor
# recorded while that job ran, and the demo's job again in a container image when one is there
# (step 5). Three files go to $OUT when set (as the device tool sets it, which
# brings back at most 8), else to bench/gpu-check-out/: summary.json (the figures), steps.tsv
# (each step's exit code and seconds) and gpu-check-files.tar.gz (every log and JSON answer).
# About 3-5 minutes; each step has its own time limit, so the whole stays under 8.
#
# Usage: bench/gpu_check.sh          on a GPU machine
#        bench/gpu_check.sh --cpu    the same steps on 2 CPU worker slots with gloo (fp32, a
#                                    smaller model): checks this script itself without a GPU
#
# It runs gpufleet from this checkout (PYTHONPATH=src) under the machine's own python3, so a
# machine whose image already has torch needs no install. Python packages the image lacks can
# be carried as wheels in .whl/ (bench/gpu_wheels.sh fetches them); they are installed into a
# private folder first.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=gpu
[ "${1:-}" = "--cpu" ] && mode=cpu
final=${OUT:-$root/bench/gpu-check-out}
mkdir -p "$final"
out=$(mktemp -d -t gpufleet-gpu-check-files.XXXXXX)
PY=${PYTHON:-python3}
[ -x "$root/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && [ "$mode" = cpu ] && PY=$root/.venv/bin/python
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpufleet-site .whl/*.whl || { echo "gpu_check: wheel install failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/gpufleet-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
scratch=$(mktemp -d -t gpufleet-gpu-check.XXXXXX)
export GPUFLEET_HOME="$scratch/home" HOME="$scratch/user"
mkdir -p "$HOME" "$scratch/cwd"
ln -s "$root/examples" "$scratch/cwd/examples"
cd "$scratch/cwd"
GF=("$PY" -m gpufleet.cli)
gf() { "${GF[@]}" "$@"; }
step() {  # step NAME LIMIT_S CMD...: stdout+stderr to NAME.log, time and exit code to steps.tsv
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$out/steps.tsv"
  echo "gpu_check: $name exit $rc after $((SECONDS - t0)) s" >&2
  return $rc
}
cleanup() { gf stop --all >/dev/null 2>&1; cd "$root"; rm -rf "$scratch" "$out"; }
trap cleanup EXIT
printf 'step\texit\tseconds\n' >"$out/steps.tsv"

# -- the machine -----------------------------------------------------------------------------
{ nvidia-smi -L 2>&1 || echo "no nvidia-smi"; nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv 2>&1 || true; } >"$out/machine.txt"
step versions 60 "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__,
torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'
if [ "$mode" = gpu ]; then
  read -r count gpu < <("$PY" -c 'from gpufleet.backends.local import nvml_devices
d = nvml_devices()[0]; print(min(len(d), 8), d[0].gpu if d else "none")' 2>>"$out/versions.log")
  if [ "${count:-0}" -lt 1 ]; then
    echo "gpu_check: NVML finds no NVIDIA GPU here (see $out/versions.log); --cpu checks the script" >&2
    exit 2
  fi
  slots=(); precision=bf16-mixed
  model='{"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 256, "tie_word_embeddings": false}'
  batch=16; steps=40
else
  count=2; gpu=cpu; slots=(--cpu-slots 2); precision=fp32
  model='{"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 256, "tie_word_embeddings": false}'
  batch=8; steps=10
fi
echo "$model" >"$out/model-config.json"
echo "gpu_check: $count x $gpu ($mode mode), figures in $out" >&2

# -- 1. the demo's job: the example GPT with DDP (NCCL on GPUs) -------------------------------
step demo 180 "${GF[@]}" run examples/gpt.py --gpu "$gpu" --count "$count" "${slots[@]}" -y --name demo \
  -- --steps 200
gf status demo --json >"$out/demo-status.json" 2>>"$out/demo.log"

# -- 2. doctor on a cluster of every device ----------------------------------------------------
gf launch --gpu "$gpu" --count "$count" "${slots[@]}" --name g -y >"$out/launch.log" 2>&1
step doctor 120 "${GF[@]}" doctor --cluster g --json
cp "$out/doctor.log" "$out/doctor.json"

# -- 3. collectives, nccl-tests style ----------------------------------------------------------
step allreduce 150 "${GF[@]}" bench allreduce --cluster g
cp calibration-g.json "$out/calibration.json" 2>/dev/null

# -- 4. FSDP job: measured peak memory and NVML telemetry, against the planner -------------------
gf run --cluster g -d --name fsdp --strategy fsdp --precision "$precision" examples/gpt.py \
  -- --config "$out/model-config.json" --batch-size "$batch" --steps "$steps" --checkpoint-every 0 \
  --log-every 5 >"$out/fsdp-start.log" 2>&1
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 180 ]; do  # keep the last snapshot taken while it ran
  gf status fsdp --json >"$scratch/now.json" 2>/dev/null || break
  status=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$scratch/now.json")
  case "$status" in
    running) cp "$scratch/now.json" "$out/fsdp-status-running.json" ;;
    starting|restarting) ;;
    *) break ;;
  esac
  sleep 2
done
gf stop fsdp >/dev/null 2>&1
gf status fsdp --json >"$out/fsdp-status.json" 2>&1
gf logs fsdp >"$out/fsdp.log" 2>&1
printf '%s\t%s\t%s\n' fsdp "$([ "$status" = succeeded ] && echo 0 || echo 1)" "$((SECONDS - t0))" >>"$out/steps.tsv"
plan_gpu=$gpu; [ "$mode" = cpu ] && plan_gpu=H100  # CPU slots have no rated peak to plan on
step plan 60 "${GF[@]}" plan --config "$out/model-config.json" --gpu "$plan_gpu" --count "$count" \
  --strategy fsdp --precision "$precision" --micro-batch "$batch" --seq "$("$PY" -c \
  'import json,sys; print(json.load(open(sys.argv[1]))["n_positions"])' "$out/model-config.json")" \
  --samples "$((batch * count * steps))" --json
cp "$out/plan.log" "$out/plan.json"
gf stop g >/dev/null 2>&1

# -- 5. the demo's job in a container image (issue 30): CDI devices, no registry -----------------
# The image is one the machine has (GPUFLEET_CHECK_IMAGE), or a tarball carried with the run
# (GPUFLEET_CHECK_IMAGE_TAR: `podman load`). A CUDA build of torch does not fit the device tool's
# 64 MiB carry, so on a bare GPU machine with neither this step says "skipped" and why. podman
# reaches GPUs through CDI: its spec is made once with nvidia-ctk when missing.
image=${GPUFLEET_CHECK_IMAGE:-}
runtime=$(command -v podman || command -v docker || true)
if [ -z "$image" ] && [ -n "${GPUFLEET_CHECK_IMAGE_TAR:-}" ] && [ -n "$runtime" ]; then
  image=$("$runtime" load -q -i "$GPUFLEET_CHECK_IMAGE_TAR" 2>>"$out/image-load.log" \
    | sed -n 's/^Loaded image[^:]*: *//p' | tail -n1)
fi
if [ -z "$runtime" ] || [ -z "$image" ]; then
  echo "skipped: ${runtime:-no podman or docker}; image '${image}' (set GPUFLEET_CHECK_IMAGE or GPUFLEET_CHECK_IMAGE_TAR)" \
    >"$out/image.log"
  printf 'image\tskipped\t0\n' >>"$out/steps.tsv"
else
  if [ "$mode" = gpu ] && [ "${runtime##*/}" = podman ] && command -v nvidia-ctk >/dev/null \
      && ! nvidia-ctk cdi list 2>/dev/null | grep -q nvidia.com/gpu; then
    nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml >"$out/cdi.log" 2>&1
  fi
  step image-doctor 120 "${GF[@]}" doctor --image "$image" --json
  step image 240 "${GF[@]}" run examples/gpt.py --gpu "$gpu" --count "$count" "${slots[@]}" -y \
    --name demo-image --image "$image" -- --steps 200
  gf status demo-image --json >"$out/demo-image-status.json" 2>>"$out/image.log"
  "$runtime" ps -a --filter label=gpufleet.job --format '{{.Names}}' >"$out/image-leftovers.txt" 2>&1
fi

# -- the figures -------------------------------------------------------------------------------
"$PY" "$root/bench/gpu_check_report.py" "$out"
rc=$?
cp "$out/summary.json" "$out/steps.tsv" "$final/"
tar czf "$final/gpu-check-files.tar.gz" -C "$out" .
echo "gpu_check: $final/summary.json, steps.tsv, gpu-check-files.tar.gz" >&2
exit $rc
