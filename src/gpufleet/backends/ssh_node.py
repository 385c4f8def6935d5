"""The node side of a run on an SSH pool: what `PYTHON -m gpufleet.backends.ssh_node ...` does
on a host, started over ssh by the driver (backends/ssh_run.py).

A host of an SSH pool shares nothing with the submitter: not the job folder, not the workdir,
not gpufleet's own files. So the node keeps its own copies, under `~/.cache/gpufleet` on the
node, and the driver maps paths both ways:

- `has DIGEST`: one JSON line: this node's gpufleet version, whether torch imports (and its
  version), and whether the workdir DIGEST is already placed (then nothing is shipped);
- `put DIGEST`: a tar of the workdir on stdin, unpacked into `workdirs/DIGEST`;
- `warm` (a spare host of the cluster): the job, the workdir's digest and the setup as one JSON
  line on stdin; the job's setup runs in the placed copy (once per digest) and the job is
  recorded as its user, so a spare that replaces a lost node starts at once; `release` drops
  the job's use of the copy (and the copy, when no job uses it) once the job is over;
- `run`: the node's plan entry and the job's secrets (the report key) as one JSON line on stdin,
  never on a command line (`ps` on the node shows none). The submitter's job folder becomes
  `jobs/JOB` on the node and the submitter's workdir the placed copy, in argv, environment and
  folder; the job's `setup` runs once per workdir digest; then the node's torchrun runs under
  the same `NodeAgent` as on Ray and Slurm (keeper, signed device samples), its lines on stdout.
  The rest of stdin is the driver's heartbeat and orders: `restart JSON` or `end CODE` is the
  supervisor's decision for a launcher that waits (backends/node_restart.py; the failed run's
  files go back before its `PARKED` line); a `stop` line ends torchrun gracefully; EOF (the
  driver or its connection gone), or no line for `SILENT_S`, ends it too, so no worker outlives a
  killed driver or a dropped connection. When torchrun has ended, the files it wrote under the
  job folder's `torchrun/` (per-rank logs, error records) go back to the driver as framed lines
  (files_back.py), and the node's job folder goes (the workdir too, on the job's last run, unless
  `keep_workdir`).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gpufleet.backends import files_back, node_net, node_workdir
from gpufleet.backends.node_image import IMAGE_FAILED_EXIT
from gpufleet.backends.node_restart import END, RESTART, order_line, parse_order
from gpufleet.errors import ImageError
from gpufleet.launch.warm_restart import Decision, parked_code

SILENT_S = 20.0  # the driver sends a line every second; this long without one: it is gone
#                 (generous: a driver on a loaded machine may stall for seconds)
SETUP_FAILED_EXIT = 78  # EX_CONFIG: the job's setup command failed on this node
POLL_S = 0.2


def cache_root() -> Path:
    return Path.home() / ".cache" / "gpufleet"


# -- pure parts ---------------------------------------------------------------------------------
def remap(text: str, pairs: list[tuple[str, str]]) -> str:
    """`text` with each path `a` of `pairs` replaced by `b` where it starts a path (the whole
    value, or followed by `/`, `:` or the end; preceded by the start, `=` or `:`)."""
    for a, b in pairs:
        if not a or a == b:
            continue
        text = re.sub(r"(^|[=:])" + re.escape(a) + r"(?=$|[/:])",
                      r"\g<1>" + b.replace("\\", "\\\\"), text)
    return text


def map_entry(entry: dict[str, Any], pairs: list[tuple[str, str]],
              ) -> tuple[list[str], dict[str, str], str]:
    """A plan entry's argv, environment and folder with the submitter's paths made the node's."""
    return ([remap(a, pairs) for a in entry["argv"]],
            {k: remap(v, pairs) for k, v in entry["env"].items()},
            remap(entry["cwd"], pairs))


# -- the node's folders -------------------------------------------------------------------------
def job_dir_of(job: str) -> Path:
    return cache_root() / "jobs" / job.replace("/", "_")


def has(digest: str) -> dict[str, Any]:
    """What the driver checks before any worker starts."""
    import gpufleet

    out: dict[str, Any] = {"version": gpufleet.__version__, "python": sys.executable,
                           "has": bool(digest) and node_workdir.has(node_workdir.cache_root(),
                                                                    digest)}
    try:
        import torch

        out["torch"] = str(torch.__version__)
    except Exception as exc:  # any import failure is the node's answer, not ours to raise
        out["torch"] = None
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    return out


def put(digest: str, stream: IO[bytes]) -> int:
    """Place the workdir tar from `stream` in the node's cache (node_workdir: unpacked into a
    temp sibling, then renamed); the bytes received."""
    data = stream.read()  # at most the upload cap (100 MB by default)
    node_workdir.place(node_workdir.cache_root(), digest, io.BytesIO(data), "", _say)
    return len(data)


def warm(order: dict[str, Any]) -> dict[str, str]:
    """A spare host readied for the job: its setup run (once per digest) in the placed copy,
    the job recorded as a user of it. Says whether the setup ran now or had run before."""
    root = node_workdir.cache_root()
    setup = order.get("setup") or ""
    before = node_workdir.setup_marker(root, order["digest"], setup).exists()
    node_workdir.place(root, order["digest"], None, setup, lambda ln: _say(f"setup: {ln}"),
                       node=f"spare {order.get('node', '')}", user=order["job"])
    return {"setup": "none" if not setup else "done before" if before else "ran"}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def send_back(node_job: Path, out: IO[str], since: float = 0.0) -> int:
    """Every file torchrun wrote under the node's job folder (`torchrun/`: per-rank logs, error
    records) since `since` as framed lines (files_back); how many. The folder is this run's
    alone."""
    lines = files_back.framed(node_job, since=since)
    for line in lines:
        out.write(line + "\n")
    out.flush()
    return len(lines)


# -- run ----------------------------------------------------------------------------------------
def run(order: dict[str, Any], stdin: IO[str]) -> int:
    from gpufleet.backends.node_agent import NodeAgent

    entry = order["node"]
    import gpufleet

    digest = order.get("digest") or ""
    job = job_dir_of(order["job"])
    job.mkdir(parents=True, exist_ok=True)
    for name, content in entry.get("files", {}).items():  # framework configs (ds_config.json)
        (job / Path(name).name).write_text(content)
    root = node_workdir.cache_root()
    placed = root / digest if digest else Path(order["maps"]["workdir"])
    pairs = [(order["maps"]["job_dir"], str(job)), (order["maps"]["workdir"], str(placed)),
             (order["maps"]["gpufleet"], str(Path(gpufleet.__file__).parent))]
    argv, env, cwd = map_entry(entry, pairs)
    code = 1
    job_ends = threading.Event()
    try:
        if digest:
            try:
                node_workdir.place(root, digest, None, order.get("setup") or "",
                                   lambda ln: _say(f"setup: {ln}"),
                                   node=f"{entry['name']} ({entry['node_id']})", user=order["job"])
            except (node_workdir.SetupFailed, node_workdir.WorkdirMissing) as exc:
                _say(f"NodeSetupError: {exc}")
                code = SETUP_FAILED_EXIT
                return code
        agent = NodeAgent(entry["node_id"], order["report_addr"])

        def on_order(line: str) -> None:
            """A restart's order (node_restart.py): its variables with the node's paths."""
            got = parse_order(line)
            if got is None:
                return
            decision, final = got
            if decision.end is not None:
                order["final"] = order.get("final") or final  # the job is over: the copy goes
            else:
                order["final"] = final
                decision = Decision(decision.run,
                                    {k: remap(v, pairs) for k, v in decision.env.items()})
            agent.decide(order_line(decision, final))

        stop = _watch(stdin, job_ends, on_order)
        sent = [0.0]  # the files of runs before this time went back when those runs ended

        def files_first() -> None:
            """Before a `PARKED` line: the failed run's error records, which the supervisor
            reads at that line."""
            send_back(job, sys.stdout, since=sent[0])
            sent[0] = time.time() - 1.0  # mtimes are whole seconds on some file systems
        try:
            agent.start(argv, {**env, **order.get("secrets", {})}, cwd, entry["sampling"],
                        container=entry.get("container"), run=entry.get("run", ""))
        except node_net.RendezvousUnreachableError as exc:
            _say(f"RendezvousUnreachableError: {exc}")
            return code
        except ImageError as exc:
            _say(f"ImageError: {exc}")
            return IMAGE_FAILED_EXIT
        while True:
            if stop.is_set():
                agent.stop(grace_s=8.0)
                _print(agent.drain()[0], pairs)
                code = 143
                break
            lines, ended = agent.drain()
            _print(lines, pairs, files_first)
            if ended is not None:
                code = ended
                break
            time.sleep(POLL_S)
        send_back(job, sys.stdout)
        return code
    finally:
        shutil.rmtree(job, ignore_errors=True)
        # the job's last run (it succeeded, was stopped, or has no restart left): its copy goes
        if digest and not order.get("keep_workdir") and (
                order.get("final") or code == 0 or job_ends.is_set()):
            node_workdir.remove(root, digest, user=order["job"])


def _watch(stdin: IO[str], job_ends: threading.Event,
           on_order: Callable[[str], None]) -> threading.Event:
    """Set when the driver asks to stop, is gone (EOF), or has been silent for SILENT_S.
    `job_ends` is set too when the stop ends the job (`stop job`: the user stopped it), not
    only this run (`stop`: a peer failed, the job may restart here). A restart's order
    (`restart ...`, `end N`) goes to `on_order`."""
    stop = threading.Event()
    last = [time.monotonic()]

    def read() -> None:
        for line in iter(stdin.readline, ""):
            last[0] = time.monotonic()
            if line.startswith("stop"):
                if line.strip() == "stop job":
                    job_ends.set()
                break
            if line.startswith((RESTART, END)):
                on_order(line)
        stop.set()

    def silent() -> None:
        while not stop.wait(1.0):
            if time.monotonic() - last[0] > SILENT_S:
                stop.set()

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=silent, daemon=True).start()
    return stop


def _print(lines: list[str], pairs: list[tuple[str, str]],
           before_park: Callable[[], None] | None = None) -> None:
    """torchrun's lines, with node paths (`error_file: PATH`) as the submitter's;
    `before_park` is called before a launcher's `PARKED` line."""
    back = [(b, a) for a, b in pairs]
    for ln in lines:
        if before_park is not None and parked_code(ln) is not None:
            sys.stdout.flush()
            before_park()
        sys.stdout.write(_unmap_line(ln, back) + "\n")
    sys.stdout.flush()


def _unmap_line(line: str, back: list[tuple[str, str]]) -> str:
    for a, b in back:
        if a and a != b:
            line = re.sub(re.escape(a) + r"(?=$|[/:\s])", b.replace("\\", "\\\\"), line)
    return line


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    verb = args[0] if args else ""
    if verb == "has":
        print(json.dumps(has(args[1] if len(args) > 1 else "")), flush=True)
        return 0
    if verb == "put":
        print(json.dumps({"bytes": put(args[1], sys.stdin.buffer)}), flush=True)
        return 0
    if verb == "warm":
        try:
            print(json.dumps(warm(json.loads(sys.stdin.readline()))), flush=True)
        except (node_workdir.SetupFailed, node_workdir.WorkdirMissing) as exc:
            print(f"NodeSetupError: {exc}", flush=True)
            return SETUP_FAILED_EXIT
        return 0
    if verb == "release":
        order = json.loads(sys.stdin.readline())
        removed = node_workdir.remove(node_workdir.cache_root(), order["digest"],
                                      user=order["job"])
        print(json.dumps({"removed": removed}), flush=True)
        return 0
    if verb == "run":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ended through stdin, not by signals
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        order = json.loads(sys.stdin.readline())
        return run(order, sys.stdin)
    print(f"usage: python -m gpufleet.backends.ssh_node has|put|warm|release|run; got {verb!r}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
