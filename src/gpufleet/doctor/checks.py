"""The doctor's checks: pure functions from one node's facts to findings.

Nothing here starts a process, reads a file or imports torch: `facts.py` gathers the facts, and
these functions judge them, so every verdict (a driver too old, a Docker-sized /dev/shm, a missing
network interface) is tested with hand-made facts on a machine without a GPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpufleet.doctor.model import (
    DISK_FAIL_BYTES,
    DISK_WARN_BYTES,
    GIB,
    MIB,
    NCCL_DEBUG_LEVELS,
    NCCL_P2P_LEVELS,
    NOFILE_FAIL,
    NOFILE_WARN,
    RESULT_MARKER,
    SHM_FAIL_BYTES,
    SHM_WARN_BYTES,
    TOPOLOGY_MEANING,
    Check,
    NodeFacts,
    Status,
    Topology,
)
from gpufleet.doctor.state_check import state_file_check
from gpufleet.plan.comm import algbw_to_busbw
from gpufleet.pool.model import Device
from gpufleet.vocab import NVLINK_NETWORKS


def _ids(devices: tuple[Device, ...] | list[Device]) -> str:
    return ", ".join(d.id for d in devices) or "none"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def devices(f: NodeFacts) -> Check:
    t = f.target
    gpus = [d for d in f.visible if d.gpu != "cpu"]
    slots = [d for d in f.visible if d.gpu == "cpu"]
    unknown = [d for d in gpus if not d.healthy]
    if t.cluster is None:
        if t.on_cpu:
            why = f" (NVML: {f.nvml_error})" if f.nvml_error else ""
            return Check("devices", "pass", f"no GPU{why}; {len(slots)} CPU slots on {f.cpu_count} "
                         f"cores; doctor uses {len(t.devices)} gloo workers")
        kinds: dict[str, int] = {}
        for d in gpus:
            kinds[d.gpu] = kinds.get(d.gpu, 0) + 1
        detail = (f"{len(gpus)} GPUs visible ({', '.join(f'{n} x {k}' for k, n in kinds.items())}): "
                  f"{_ids(gpus)}")
        if unknown:
            return Check("devices", "warn", detail + f"; not in the catalog: {_ids(unknown)}",
                         "add the type to gpufleet/catalog/data/gpus.csv (its nvml_match column) "
                         "so plans and prices know it")
        return Check("devices", "pass", detail)

    held = f"cluster {t.cluster} holds {_ids(t.devices)}"
    if t.on_cpu:
        seen = {d.id for d in slots}
        problems, fixes = [], []
        missing = [d for d in t.devices if d.id not in seen]
        if missing:
            problems.append(f"this host now offers {len(slots)} CPU slots, so {_ids(missing)} "
                            "are past the end")
            fixes.append("set GPUFLEET_CPU_SLOTS (or --cpu-slots) as it was at launch")
        if len(t.devices) > f.cpu_count:
            problems.append(f"{len(t.devices)} workers on {f.cpu_count} cores: they will contend")
            fixes.append("launch with --count at most the number of cores")
        if problems:
            return Check("devices", "warn", f"{held}; " + "; ".join(problems), "; ".join(fixes))
        return Check("devices", "pass", f"{held}; this host offers {len(slots)} CPU slots on "
                     f"{f.cpu_count} cores")

    if f.nvml_error is not None:
        return Check("devices", "fail", f"{held} but NVML sees no GPU: {f.nvml_error}",
                     "check `nvidia-smi`; install or reload the NVIDIA driver and nvidia-ml-py")
    by_id = {d.id: d for d in gpus}
    gone = [d for d in t.devices if d.id not in by_id]
    changed = [f"{d.id} is {by_id[d.id].gpu}, not {t.gpu}" for d in t.devices
               if d.id in by_id and by_id[d.id].gpu != t.gpu and by_id[d.id].healthy]
    sick = [by_id[d.id] for d in t.devices if d.id in by_id and not by_id[d.id].healthy]
    seen_text = f"NVML sees {len(gpus)}: {_ids(gpus)}"
    if gone or changed:
        problems = ([f"not visible: {_ids(gone)}"] if gone else []) + changed
        fixes = (["a GPU missing from `nvidia-smi` has fallen off the bus: check `dmesg` for Xid "
                  "errors, reset it (`nvidia-smi -r -i N`) or reboot"] if gone else []) + \
            (["the hardware changed since launch"] if changed else [])
        return Check("devices", "fail", f"{held}; " + "; ".join(problems) + f" ({seen_text})",
                     "; ".join(fixes) + f"; then `gpufleet stop {t.cluster}` and launch again")
    if sick:
        return Check("devices", "warn", f"{held}; unknown to the catalog: "
                     + ", ".join(d.gpu for d in sick),
                     "add the type to gpufleet/catalog/data/gpus.csv (its nvml_match column)")
    return Check("devices", "pass", f"{held}; all visible ({seen_text})")


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def versions(f: NodeFacts) -> Check:
    v = f.versions
    shown = [f"torch {v.torch}"]
    if v.torch_cuda:
        shown.append(f"CUDA runtime {v.torch_cuda}")
    if v.driver:
        shown.append(f"driver {v.driver} (CUDA {v.cuda_driver or '?'})")
    if v.nccl:
        shown.append(f"NCCL {v.nccl}")
    shown.append(f"gloo {'yes' if v.gloo_available else 'no'}")
    detail = ", ".join(shown)
    data = {"driver": v.driver, "cuda_driver": v.cuda_driver, "torch": v.torch,
            "torch_cuda": v.torch_cuda, "nccl": v.nccl, "gloo": v.gloo_available}
    if f.target.on_cpu:
        if not v.gloo_available:
            return Check("versions", "fail", f"{detail}: CPU workers need gloo", "install an "
                         "official torch wheel (`pip install torch==2.13.0`); they include gloo", data)
        return Check("versions", "pass", f"no GPU: gloo on CPU; {detail}", data=data)
    if v.torch_cuda is None:
        return Check("versions", "fail", f"{detail}: a CPU build of torch cannot use the GPUs",
                     "install a CUDA build of torch (pytorch.org/get-started lists the index URL "
                     "for each CUDA version)", data)
    have, need = _major_minor(v.cuda_driver or ""), _major_minor(v.torch_cuda)
    if have is not None and need is not None and need > have:
        fix = (f"upgrade the NVIDIA driver to one that supports CUDA {v.torch_cuda}, or install "
               f"a torch build for CUDA {v.cuda_driver} or older")
        if need[0] > have[0]:
            return Check("versions", "fail", f"{detail}: torch needs CUDA {v.torch_cuda}, newer "
                         "than the driver supports", fix, data)
        # CUDA's minor-version compatibility runs a newer 12.x runtime on an older 12.x driver,
        # but kernels that need the newer driver (PTX compiled at load time) fail.
        return Check("versions", "warn", f"{detail}: torch's CUDA {v.torch_cuda} is newer than "
                     "the driver's; it runs under minor-version compatibility, with limits",
                     fix, data)
    if not v.cuda_available:
        return Check("versions", "fail", f"{detail}: torch.cuda.is_available() is False",
                     "check CUDA_VISIBLE_DEVICES and `nvidia-smi`; the driver may need a reload", data)
    if not v.nccl_available:
        return Check("versions", "fail", f"{detail}: this torch has no NCCL",
                     "install an official CUDA build of torch; they include NCCL", data)
    return Check("versions", "pass", detail, data=data)


BF16_FIX = ("run with `gpufleet run --precision fp16-mixed` (fp16 autocast with dynamic loss "
            "scaling) or fp32")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16(f: NodeFacts) -> Check:
    if f.target.on_cpu:
        native = [flag for flag in CPU_BF16_FLAGS if flag in f.cpu_flags]
        if native:
            return Check("bf16", "pass", f"CPU slots: this CPU computes bf16 natively "
                         f"({', '.join(native)})")
        return Check("bf16", "pass", "CPU slots: no AVX512-BF16/AMX, so bf16 is emulated and "
                     "slow here; fp32 is the faster choice on this CPU")
    problems, fine = [], []
    for g in f.gpu_types:
        if g.catalog_bf16 is None:
            problems.append(f"{g.name} is not in the catalog; device says "
                            f"{'bf16' if g.device_bf16 else 'no bf16' if g.device_bf16 is False else '?'}")
        elif g.device_bf16 is not None and g.device_bf16 != g.catalog_bf16:
            problems.append(f"{g.name}: catalog says {'' if g.catalog_bf16 else 'no '}bf16, the "
                            f"device (compute capability) says {'' if g.device_bf16 else 'no '}bf16")
        elif not g.catalog_bf16:
            problems.append(f"{g.name} has no bf16")
        else:
            fine.append(g.name)
    if not f.gpu_types:
        return Check("bf16", "warn", "no GPU type to judge (NVML saw none)", BF16_FIX)
    if problems:
        return Check("bf16", "warn", "; ".join(problems), BF16_FIX)
    checked = "catalog and device agree" if all(g.device_bf16 for g in f.gpu_types) else \
        "by the catalog (CUDA unavailable to confirm)"
    verb = "supports" if len(fine) == 1 else "support"
    return Check("bf16", "pass", f"{', '.join(fine)} {verb} bf16 ({checked})")


def topology_matrix(topo: Topology, indices: tuple[int, ...]) -> list[list[str]]:
    return [[topo.link(i, j) for j in indices] for i in indices]


def topology(f: NodeFacts) -> Check:
    t = f.target
    if t.on_cpu:
        return Check("topology", "pass", "CPU slots: shared memory")
    indices = tuple(d.index for d in t.devices)
    if f.topology is None:
        return Check("topology", "warn", "NVML gave no topology", "check `nvidia-smi topo -m`")
    if len(indices) < 2:
        return Check("topology", "pass", "one GPU: no links to check")
    ids = [f"gpu{i}" for i in indices]
    matrix = topology_matrix(f.topology, indices)
    data = {"gpus": ids, "matrix": matrix}
    pairs = [(i, j) for a, i in enumerate(indices) for j in indices[a + 1:]]
    counts: dict[str, int] = {}
    for i, j in pairs:
        counts[f.topology.link(i, j)] = counts.get(f.topology.link(i, j), 0) + 1
    summary = f"{len(indices)} GPUs, {len(pairs)} pairs: " + ", ".join(
        f"{n} {label}" for label, n in sorted(counts.items()))
    slow = [(i, j) for i, j in pairs if not f.topology.link(i, j).startswith("NV")]
    if t.network in NVLINK_NETWORKS and slow:
        shown = ", ".join(f"gpu{i}-gpu{j} {f.topology.link(i, j)}" for i, j in slow[:4])
        more = f" and {len(slow) - 4} more" if len(slow) > 4 else ""
        labels = sorted({f.topology.link(i, j) for i, j in slow})
        legend = "; ".join(f"{k}: {TOPOLOGY_MEANING[k]}" for k in labels if k in TOPOLOGY_MEANING)
        return Check("topology", "warn", f"{summary}; the cluster is declared {t.network} but "
                     f"{shown}{more} have no NVLink ({legend}), so NCCL goes through PCIe there",
                     "launch on GPUs that share NVLink (see `nvidia-smi topo -m`), or declare "
                     "--network pcie so plans use PCIe bandwidth", data)
    return Check("topology", "pass", summary, data=data)


def _ifname_nccl(value: str, interfaces: frozenset[str]) -> tuple[Status, str]:
    """NCCL_SOCKET_IFNAME: a comma list of name prefixes; a leading ^ excludes them, a leading =
    (after any ^) means exact names (NCCL user guide, Environment Variables)."""
    rest, exclude = (value[1:], True) if value.startswith("^") else (value, False)
    rest, exact = (rest[1:], True) if rest.startswith("=") else (rest, False)
    names = [n.strip() for n in rest.split(",") if n.strip()]

    def hits(name: str) -> set[str]:
        return {i for i in interfaces if (i == name if exact else i.startswith(name))}

    matched: set[str] = set().union(*(hits(n) for n in names)) if names else set()
    if exclude:
        left = sorted(interfaces - matched)
        if not left:
            return "fail", f"NCCL_SOCKET_IFNAME={value} excludes every interface"
        return "pass", f"NCCL_SOCKET_IFNAME={value} (leaves {', '.join(left)})"
    if not matched:
        return "fail", f"NCCL_SOCKET_IFNAME={value}: no interface matches (have " \
                       f"{', '.join(sorted(interfaces)) or 'none'})"
    absent = [n for n in names if not hits(n)]
    if absent:
        return "warn", f"NCCL_SOCKET_IFNAME={value}: {', '.join(absent)} match no interface"
    return "pass", f"NCCL_SOCKET_IFNAME={value} (uses {', '.join(sorted(matched))})"


def _ifname_gloo(value: str, interfaces: frozenset[str]) -> tuple[Status, str]:
    """GLOO_SOCKET_IFNAME: exact interface names, comma separated; gloo refuses a missing one."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if value.startswith("^"):
        return "fail", f"GLOO_SOCKET_IFNAME={value}: gloo takes exact names, not NCCL's ^ exclusion"
    absent = [n for n in names if n not in interfaces]
    if absent:
        return "fail", f"GLOO_SOCKET_IFNAME={value}: no interface named {', '.join(absent)}"
    return "pass", f"GLOO_SOCKET_IFNAME={value}"


_RANK: dict[Status, int] = {"pass": 0, "warn": 1, "fail": 2}


def _worst(statuses: list[Status]) -> Status:
    return max(statuses, key=lambda s: _RANK[s], default="pass")


def nccl_env(f: NodeFacts) -> Check:
    env, network = f.env, f.target.network
    have = ", ".join(sorted(f.interfaces)) or "none"
    found: list[tuple[Status, str, str]] = []  # (status, what, fix)
    nccl_if = env.get("NCCL_SOCKET_IFNAME", "")
    if nccl_if:
        status, what = _ifname_nccl(nccl_if, f.interfaces)
        found.append((status, what, f"set NCCL_SOCKET_IFNAME to interfaces that exist ({have}), "
                      "or unset it to let NCCL choose" if status != "pass" else ""))
    gloo_if = env.get("GLOO_SOCKET_IFNAME", "")
    if gloo_if:
        status, what = _ifname_gloo(gloo_if, f.interfaces)
        found.append((status, what, f"set GLOO_SOCKET_IFNAME to exact interface names ({have}), "
                      "or unset it" if status != "pass" else ""))
    for name in ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE"):
        value = env.get(name)
        if value is None:
            continue
        if value.strip() not in ("0", "1"):
            found.append(("fail", f"{name}={value} is not 0 or 1 (NCCL reads it as a number)",
                          f"set {name}=0 or {name}=1"))
        else:
            found.append(("pass", f"{name}={value}", ""))
    if env.get("NCCL_P2P_DISABLE", "").strip() == "1" and network in NVLINK_NETWORKS:
        found.append(("warn", f"NCCL_P2P_DISABLE=1 turns NVLink off for NCCL, on a cluster "
                      f"declared {network}",
                      "unset NCCL_P2P_DISABLE"))
    if env.get("NCCL_IB_DISABLE", "").strip() == "1" and network == "infiniband":
        found.append(("warn", "NCCL_IB_DISABLE=1 on an infiniband cluster sends NCCL over TCP",
                      "unset NCCL_IB_DISABLE (the infiniband preset sets 0)"))
    debug = env.get("NCCL_DEBUG")
    if debug is not None:
        ok = debug.strip().upper() in NCCL_DEBUG_LEVELS
        found.append(("pass" if ok else "warn", f"NCCL_DEBUG={debug}" + (
            "" if ok else f" is not one of {', '.join(NCCL_DEBUG_LEVELS)}"),
            "" if ok else "set NCCL_DEBUG=WARN (or INFO to see NCCL's choices)"))
    level = env.get("NCCL_P2P_LEVEL")
    if level is not None:
        ok = level.strip().upper() in NCCL_P2P_LEVELS or level.strip() in ("0", "1", "2", "3", "4", "5")
        found.append(("pass" if ok else "warn", f"NCCL_P2P_LEVEL={level}" + (
            "" if ok else f" is not one of {', '.join(NCCL_P2P_LEVELS)}"),
            "" if ok else "set NCCL_P2P_LEVEL=NVL or unset it"))
    if not found:
        return Check("nccl-env", "pass", "no NCCL_*/GLOO_* settings: library defaults")
    status = _worst([s for s, _, _ in found])
    shown = [what for s, what, _ in found if s != "pass"] or [what for _, what, _ in found]
    if status != "pass" and f.target.on_cpu and any("NCCL" in w for w in shown):
        shown.append("gloo on CPU ignores NCCL_*, but a GPU job started from this environment "
                     "gets it")
    fixes = [fix for s, _, fix in found if s != "pass" and fix]
    return Check("nccl-env", status, "; ".join(shown), "; ".join(dict.fromkeys(fixes)))


SHM_FIX = ("give the container a bigger /dev/shm: `docker run --shm-size=16g` (or `--ipc=host`); "
           "on Kubernetes mount an emptyDir with medium: Memory at /dev/shm")


def shm(f: NodeFacts) -> Check:
    s = f.shm
    if s is None:
        return Check("shm", "warn", "no /dev/shm: DataLoader workers and NCCL's shared-memory "
                     "transport need it", "mount a tmpfs at /dev/shm; " + SHM_FIX)
    detail = f"{s.path}: {_gib(s.free_bytes)} free of {_gib(s.total_bytes)}"
    data = {"total_bytes": s.total_bytes, "free_bytes": s.free_bytes}
    if s.free_bytes >= SHM_WARN_BYTES:
        return Check("shm", "pass", detail, data=data)
    fix = SHM_FIX if s.total_bytes < SHM_WARN_BYTES else (
        f"free space in {s.path}: crashed jobs leave segments behind (`ls -la {s.path}`)")
    status: Status = "fail" if s.free_bytes < SHM_FAIL_BYTES else "warn"
    limit, why = (SHM_FAIL_BYTES, "DataLoader workers and NCCL will fail") if status == "fail" \
        else (SHM_WARN_BYTES, "large batches through DataLoader workers may not fit")
    return Check("shm", status, f"{detail}: under {_gib(limit)}, {why}", fix, data)


def open_files(f: NodeFacts) -> Check:
    soft, hard = f.nofile_soft, f.nofile_hard
    detail = f"soft limit {soft}, hard {hard}"
    data = {"soft": soft, "hard": hard}
    if soft >= NOFILE_WARN:
        return Check("open-files", "pass", detail, data=data)
    if hard >= NOFILE_WARN:
        fix = f"`ulimit -n {NOFILE_WARN}` in the shell that starts gpufleet (the hard limit allows it)"
    else:
        fix = (f"raise the hard limit (`nofile {NOFILE_WARN}` in /etc/security/limits.conf, "
               f"LimitNOFILE={NOFILE_WARN} for a systemd unit, `docker run --ulimit "
               f"nofile={NOFILE_WARN}:{NOFILE_WARN}`), then `ulimit -n {NOFILE_WARN}`")
    if soft < NOFILE_FAIL:
        return Check("open-files", "fail", f"{detail}: under {NOFILE_FAIL}, DataLoader workers and "
                     "per-peer sockets run out of descriptors", fix, data)
    return Check("open-files", "warn", f"{detail}: under {NOFILE_WARN}, many DataLoader workers "
                 "or ranks can hit 'Too many open files'", fix, data)


def disk(f: NodeFacts) -> Check:
    d = f.disk
    if d.free_bytes is None:
        return Check("disk", "fail", f"{d.path}: {d.error or 'unknown free space'}",
                     "point GPUFLEET_HOME at a writable folder on a disk with room for checkpoints")
    detail = f"{_gib(d.free_bytes)} free under {d.path} (job folders and checkpoints)"
    data = {"path": d.path, "free_bytes": d.free_bytes}
    if d.free_bytes >= DISK_WARN_BYTES:
        return Check("disk", "pass", detail, data=data)
    status: Status = "fail" if d.free_bytes < DISK_FAIL_BYTES else "warn"
    limit = DISK_FAIL_BYTES if status == "fail" else DISK_WARN_BYTES
    return Check("disk", status, f"{detail}: under {_gib(limit)}, checkpoints may not fit",
                 "free space there, or set GPUFLEET_HOME to a bigger disk", data)


def bus_bandwidth(algbw: float, workers: int) -> float:
    """nccl-tests' all-reduce bus bandwidth, comparable with link speeds (the planner's
    `comm.algbw_to_busbw`, which `gpufleet bench` uses too)."""
    return algbw_to_busbw("all_reduce", algbw, workers)


def parse_results(output: tuple[str, ...]) -> dict[int, dict[str, Any]]:
    """Worker reports by rank, from lines carrying RESULT_MARKER (torchrun may prefix them)."""
    found: dict[int, dict[str, Any]] = {}
    decoder = json.JSONDecoder()
    for line in output:
        for chunk in line.split(RESULT_MARKER)[1:]:  # a line may carry two, if writes interleaved
            try:
                record, _ = decoder.raw_decode(chunk)
                found[int(record["rank"])] = record
            except (ValueError, KeyError, TypeError):
                continue
    return found


# An exception's last line ("RuntimeError: ...", "torch.distributed.DistBackendError: ...") or an
# NCCL warning: what a worker died of, as opposed to torchrun's report around it.
_CAUSE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Timeout)\b.*:|.*NCCL WARN)")


def failure_lines(output: tuple[str, ...], lines: int = 3) -> str:
    """The workers' own error messages, deduplicated; else the last lines of the output."""
    kept = [ln.strip() for ln in output if ln.strip() and RESULT_MARKER not in ln]
    causes = [ln for ln in kept if _CAUSE.match(ln) and "ChildFailedError" not in ln]
    picked = list(dict.fromkeys(causes))[-lines:] or kept[-lines * 2:]
    return " | ".join(picked) or "no output"


def _size(n_bytes: int) -> str:
    if n_bytes == 4:
        return "1-element"  # one float32
    return f"{n_bytes / MIB:g} MiB" if n_bytes >= MIB else f"{n_bytes} B"


def allreduce(f: NodeFacts) -> Check:
    run = f.allreduce
    n, want = run.workers, run.workers * (run.workers + 1) / 2
    who = f"{n} {run.backend} workers"
    retry = "rerun with NCCL_DEBUG=INFO (GPU) or TORCH_DISTRIBUTED_DEBUG=DETAIL to see where it stops"
    if run.timed_out:
        return Check("all-reduce", "fail", f"{who} did not finish in {run.timeout_s:g} s: "
                     f"{failure_lines(run.output)}", "a hang is usually the network: check the nccl-env "
                     f"check and firewalls; {retry}", {"output": list(run.output[-40:])})
    results = parse_results(run.output)
    missing = sorted(set(range(n)) - set(results))
    if run.returncode != 0 or missing:
        lost = f" (no result from rank {', '.join(map(str, missing))})" if missing else ""
        return Check("all-reduce", "fail", f"{who} failed, exit code {run.returncode}{lost}: "
                     f"{failure_lines(run.output)}", retry, {"output": list(run.output[-40:])})
    wrong = [f"rank {r}: {_size(c['bytes'])} summed to {c['got_min']:g}..{c['got_max']:g}"
             for r, rec in sorted(results.items()) for c in rec["sums"] if c["wrong"]]
    sizes = " and ".join(_size(c["bytes"]) for c in results[0]["sums"])
    if wrong:
        return Check("all-reduce", "fail", f"{who}: wrong sums, want {want:g}; " + "; ".join(wrong),
                     "wrong results with no error point at a broken device or driver: run the "
                     "vendor's diagnostics (`dcgmi diag -r 2`) and the test again",
                     {"ranks": [results[r] for r in sorted(results)]})
    slowest = max(rec["seconds_per_iter"] for rec in results.values())
    timed = int(results[0]["timed_bytes"])
    algbw = timed / slowest / 1e9 if slowest > 0 else 0.0
    busbw = bus_bandwidth(algbw, n)
    data = {"workers": n, "backend": run.backend, "sum": want, "timed_bytes": timed,
            "iterations": results[0]["iterations"], "seconds_per_iter": slowest,
            "algbw_gbps": round(algbw, 3), "busbw_gbps": round(busbw, 3)}
    return Check("all-reduce", "pass", f"{who}: every element summed to {want:g} ({sizes} tensors); "
                 f"{_size(timed)}: {slowest * 1e3:.2f} ms, algbw {algbw:.2f} GB/s, busbw "
                 f"{busbw:.2f} GB/s", data=data)


ALL_CHECKS = (devices, versions, bf16, topology, nccl_env, shm, open_files, disk, allreduce)


def run_all(f: NodeFacts) -> list[Check]:
    """Every check; the state file's too when it was looked at (`gpufleet doctor` on this
    host looks)."""
    found = [check(f) for check in ALL_CHECKS]
    return found if f.state is None else [*found, state_file_check(f.state)]


def summary(checks: list[Check]) -> dict[str, int]:
    return {"passed": sum(c.status == "pass" for c in checks),
            "warnings": sum(c.status == "warn" for c in checks),
            "failed": sum(c.status == "fail" for c in checks)}


def summary_line(counts: Mapping[str, int]) -> str:
    w = counts["warnings"]
    return f"{counts['passed']} passed, {w} warning{'' if w == 1 else 's'}, {counts['failed']} failed"
