"""One run of a job on an SSH pool: a local driver and one node agent per host, over ssh.

`python -m gpufleet.backends.ssh_run PLAN.json` is what the supervisor starts in place of
torchrun. The hosts share nothing with this machine, so before any worker starts the driver,
for all hosts at once and over one multiplexed connection per host (ssh_conn.options):

1. asks the node (`ssh_node has DIGEST`) for its gpufleet version (it must be the submitter's),
   whether torch imports, and whether the workdir is already there;
2. ships the workdir as a tar on stdin (`ssh_node put DIGEST`) only where it is missing, and
   says how many bytes went to each node (an unchanged workdir ships nothing);
3. starts `ssh_node run` on every host with the node's plan entry and the job's secrets as JSON
   on stdin (no secret on any command line), then writes a heartbeat line every second;
4. warms the cluster's spare hosts (`--spares`) while the run goes on: the same version check
   and shipping, then `ssh_node warm` runs the job's setup there, so a spare that replaces a
   lost node starts its torchrun at once. On the job's last run they are let go (`release`).

The watch over the nodes is `node_driver.NodeDriver`'s (fail fast, lines tagged by node, lost
nodes, restarts in place, stop); a restart's order goes to the nodes on the heartbeat's stdin.
Files the nodes send back as framed lines (per-rank logs, error records) are
written into the submitter's job folder at the same relative path, so `status` and the failure
reason read them as on the local pool. A host is lost when its connection ends (ssh exits 255:
the keepalives notice a dead or cut-off host in about 4 s) or a node failed, and a fresh short
connection to it then fails too; a worker failing on its own is not a lost host.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.backends import files_back, ssh_conn
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.node_driver import NodeDriver, pump, tag
from gpufleet.backends.ssh_conn import Host
from gpufleet.backends.ssh_plan import prepare as prepare  # the engine's `prepare` delegates here
from gpufleet.launch import workdir
from gpufleet.reportauth import KEY_ENV

PLACE_FAILED_EXIT = 70
PREPARE_TIMEOUT_S = 120.0  # version check, torch import, shipping: per host
WARM_TIMEOUT_S = 3600.0  # a spare's setup (a `pip install`) may take long; the run goes on
PROBE_TIMEOUT_S = 3  # a fresh connection to a host that looks lost
LOST_SSH_EXIT = 255  # ssh's own exit when the connection failed or dropped
NODE_MODULE = "gpufleet.backends.ssh_node"


class Driver(NodeDriver):
    """A run's nodes as `ssh_node run` sessions, one per host."""

    def __init__(self, plan: dict[str, Any], plan_path: Path):
        super().__init__(plan, plan_path.with_suffix(".lost"))
        self.plan_path = plan_path
        self.ssh = ssh = plan["ssh"]
        self.job_dir = Path(ssh["job_dir"])
        self.known_hosts = Path(ssh["known_hosts"])
        self.control_dir = Path(ssh["control_dir"])
        self.hosts = [Host.from_json(ssh["hosts"][n["node_id"]]) for n in self.nodes]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        self.closing = threading.Event()
        self.write_lock = threading.Lock()
        self.packed: bytes | None = None
        self.spares = {nid: Host.from_json(h) for nid, h in ssh.get("spares", {}).items()}
        self.warming: threading.Thread | None = None

    # -- ssh ------------------------------------------------------------------------------------
    def argv(self, i: int, verb: list[str], shared: bool = True) -> list[str]:
        host = self.hosts[i]
        return ssh_conn.ssh_argv(host, self.known_hosts, [host.python, "-m", NODE_MODULE, *verb],
                                 self.control_dir if shared else None)

    def call(self, i: int, verb: list[str], data: bytes = b"") -> tuple[int, str, str]:
        return self.call_argv(self.argv(i, verb), data)

    def call_argv(self, argv: list[str], data: bytes = b"",
                  timeout_s: float = PREPARE_TIMEOUT_S) -> tuple[int, str, str]:
        try:
            done = subprocess.run(argv, input=data, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return LOST_SSH_EXIT, "", f"no answer in {timeout_s:.0f} s"
        return (done.returncode, done.stdout.decode("utf-8", "replace"),
                done.stderr.decode("utf-8", "replace"))

    def where(self, i: int) -> str:
        n = self.nodes[i]
        return f"{n['name']} ({self.hosts[i].address})"

    # -- before any worker starts ---------------------------------------------------------------
    def ready(self, i: int) -> tuple[str, str]:
        """('', '') when node `i` is ready; ('lost', why) or ('bad', why) otherwise."""
        digest = self.ssh["digest"]
        code, out, err = self.call(i, ["has", digest])
        last = out.strip().splitlines()[-1] if out.strip() else ""
        if code == LOST_SSH_EXIT:  # lost only if a fresh connection fails too
            kind = "bad" if self.reachable(i) else "lost"
            return kind, f"{self.where(i)}: ssh: {_first(err) or 'connection failed'}"
        try:
            facts = json.loads(last)
        except ValueError:
            return "bad", (f"{self.where(i)}: `{self.hosts[i].python} -m {NODE_MODULE}` failed "
                           f"(exit {code}): {_first(err) or _first(out) or 'no output'}; is "
                           "gpufleet installed for that Python on the node?")
        mine = self.ssh["version"]
        if facts.get("version") != mine:
            return "bad", (f"gpufleet versions differ: node {self.where(i)} has "
                           f"{facts.get('version')} ({facts.get('python')}), this machine "
                           f"{mine}; install gpufleet {mine} on the node")
        if not facts.get("torch"):
            return "bad", (f"node {self.where(i)} cannot import torch with "
                           f"{facts.get('python')}: {facts.get('torch_error')}")
        if digest and not facts.get("has"):
            code, out, err = self.call(i, ["put", digest], self.tar())
            if code != 0:
                kind = "lost" if code == LOST_SSH_EXIT else "bad"
                return kind, f"{self.where(i)}: shipping the workdir failed: {_first(err)}"
            sent = json.loads(out.strip().splitlines()[-1])["bytes"]
            self.say(f"workdir {digest[:12]}: {sent} bytes shipped to {self.where(i)}")
        elif digest:
            self.say(f"workdir {digest[:12]}: 0 bytes shipped to {self.where(i)} (already there)")
        return "", ""

    def tar(self) -> bytes:
        """The workdir's tar, made once for every node that lacks it."""
        with self.write_lock:
            if self.packed is None:
                sel = workdir.select(Path(self.ssh["root"]), self.ssh["max_upload"])
                if sel.digest != self.ssh["digest"]:
                    raise OSError("the workdir changed since the run was prepared")
                buf = io.BytesIO()
                workdir.write_tar(sel, buf)
                self.packed = buf.getvalue()
            return self.packed

    def place(self) -> int | None:
        self.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # ssh's sockets
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            answers = list(pool.map(self.ready, range(len(self.nodes))))
        lost = {self.nodes[i]["node_id"] for i, (k, _) in enumerate(answers) if k == "lost"}
        if lost:
            self.lost("cannot reach host(s): " + "; ".join(w for k, w in answers if k == "lost"),
                      lost)
            return NODE_LOST_EXIT
        bad = [w for k, w in answers if k == "bad"]
        if bad:
            for why in bad:
                sys.stdout.write(f"NodeSetupError: {why}\n")
            sys.stdout.flush()
            return PLACE_FAILED_EXIT
        key = {KEY_ENV: os.environ[KEY_ENV]} if KEY_ENV in os.environ else {}
        for i, n in enumerate(self.nodes):
            order = {k: self.ssh[k] for k in ("job", "maps", "digest", "setup", "keep_workdir",
                                              "final")}
            order.update(node=n, secrets=key, report_addr=self.plan["report_addr"])
            proc = subprocess.Popen(self.argv(i, ["run"]), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(order) + "\n").encode())
            proc.stdin.flush()
            self.procs.append(proc)
            reader = threading.Thread(target=pump, args=(i, proc.stdout, self.lines), daemon=True)
            reader.start()
            self.readers.append(reader)
        threading.Thread(target=self._beat, daemon=True).start()
        self.say(f"torchrun starting on {len(self.nodes)} host(s): "
                 + ", ".join(self.where(i) for i in range(len(self.nodes))))
        if self.spares and self.ssh["digest"]:
            self.warming = threading.Thread(target=self._warm_spares, daemon=True)
            self.warming.start()
        return None

    # -- spare hosts ----------------------------------------------------------------------------
    def spare_argv(self, node_id: str, verb: list[str]) -> list[str]:
        host = self.spares[node_id]  # its own connection: the run's shared ones are the nodes'
        return ssh_conn.ssh_argv(host, self.known_hosts, [host.python, "-m", NODE_MODULE, *verb])

    def _warm_spares(self) -> None:
        with ThreadPoolExecutor(max_workers=len(self.spares)) as pool:
            for line in pool.map(self.warm, sorted(self.spares)):
                self.say(line)

    def warm(self, node_id: str) -> str:
        """Spare `node_id` made ready to replace a lost node: the node checks (version, torch),
        the workdir shipped where missing, the job's setup run (once per digest, as on a node)
        and the job recorded as a user of the copy. The line that says how it went."""
        t0 = time.monotonic()
        where = f"spare {node_id} ({self.spares[node_id].address})"
        digest = self.ssh["digest"]
        code, out, err = self.call_argv(self.spare_argv(node_id, ["has", digest]))
        try:
            facts = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"{where} not warmed: {_first(err) or _first(out) or f'exit {code}'}"
        if facts.get("version") != self.ssh["version"] or not facts.get("torch"):
            return (f"{where} not warmed: gpufleet {facts.get('version')} (this machine "
                    f"{self.ssh['version']}), torch {facts.get('torch') or 'missing'}")
        sent = 0
        if not facts.get("has"):
            code, out, err = self.call_argv(self.spare_argv(node_id, ["put", digest]), self.tar())
            if code != 0:
                return f"{where} not warmed: shipping the workdir failed: {_first(err)}"
            sent = json.loads(out.strip().splitlines()[-1])["bytes"]
        order = {"job": self.ssh["job"], "digest": digest, "setup": self.ssh["setup"],
                 "node": node_id}
        code, out, err = self.call_argv(self.spare_argv(node_id, ["warm"]),
                                        (json.dumps(order) + "\n").encode(), WARM_TIMEOUT_S)
        if code != 0:
            return f"{where} not warmed: {_first(err) or out.strip()[-300:] or f'exit {code}'}"
        setup = json.loads(out.strip().splitlines()[-1]).get("setup", "none")
        return (f"{where} warm in {time.monotonic() - t0:.1f} s: workdir {digest[:12]} "
                f"{sent} bytes shipped, setup {setup}")

    def release_spares(self, code: int) -> None:
        """The job's last run ended (it succeeded, was stopped, or has no restart left): the
        spares' copies of the workdir go, as the nodes' own do (ssh_node `run`)."""
        if not self.spares or not self.ssh["digest"] or self.ssh.get("keep_workdir") or not (
                self.ssh.get("final") or code == 0 or self.stop_asked or self.over):
            return
        if self.warming is not None:
            self.warming.join(timeout=PREPARE_TIMEOUT_S)
        order = (json.dumps({"job": self.ssh["job"], "digest": self.ssh["digest"]})
                 + "\n").encode()
        with ThreadPoolExecutor(max_workers=len(self.spares)) as pool:
            list(pool.map(lambda n: self.call_argv(self.spare_argv(n, ["release"]), order),
                          sorted(self.spares)))

    def _beat(self) -> None:
        """A line a second to every node: its agent ends torchrun when they stop coming."""
        while not self.closing.wait(1.0):
            self._send(b"ping\n")

    def _send(self, data: bytes) -> None:
        with self.write_lock:
            for p in self.procs:
                if p.poll() is None and p.stdin is not None:
                    with contextlib.suppress(OSError, ValueError):
                        p.stdin.write(data)
                        p.stdin.flush()

    def _drain(self) -> None:
        while True:
            try:
                i, text = self.lines.get_nowait()
            except queue.Empty:
                break
            if files_back.write_back(self.job_dir, text):
                continue
            sys.stdout.write(tag(self.nodes[i]["name"], self.parks.saw(i, text)) + "\n")
        sys.stdout.flush()

    def relay(self, line: str) -> None:
        """An order (node_restart.py) on every node's stdin, beside the heartbeat."""
        self._send((line + "\n").encode())

    def next_is_final(self) -> bool:
        """The plan the supervisor wrote for the run it asked for says whether it is the
        job's last; the spares' copies go with it too (`release_spares`)."""
        try:
            final = bool(json.loads(self.plan_path.read_text())["ssh"]["final"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        self.ssh["final"] = final
        return final

    # -- the watch ------------------------------------------------------------------------------
    def poll(self) -> tuple[dict[int, int], set[str]]:
        codes = {}
        for i, p in enumerate(self.procs):
            c = p.poll()
            if c is not None:
                self.readers[i].join(timeout=5)  # every line and file it sent, first
                codes[i] = c
        self._drain()
        return codes, set()

    def confirm_lost(self) -> tuple[set[str], str]:
        """Every host whose connection ended, or all when a node failed: a fresh short
        connection to each; those it cannot reach are lost."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            up = list(pool.map(self.reachable, range(len(self.nodes))))
        lost = {self.nodes[i]["node_id"] for i, ok in enumerate(up) if not ok}
        return lost, "its ssh connection ended and a new one fails" if lost else ""

    def reachable(self, i: int) -> bool:
        """Whether a fresh connection of its own (not the shared one) reaches host `i`."""
        argv = ssh_conn.ssh_argv(self.hosts[i], self.known_hosts, ["true"],
                                 connect_timeout_s=PROBE_TIMEOUT_S)
        try:
            return subprocess.run(argv, capture_output=True,
                                  timeout=PROBE_TIMEOUT_S + 5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def lost_text(self, lost: set[str], how: str) -> str:
        where = ", ".join(self.where(i) for i, n in enumerate(self.nodes) if n["node_id"] in lost)
        return f"host {where} was lost mid-job ({how}); ending the other nodes"

    def end_all(self, grace_s: float) -> None:
        """`stop` to every node (its agent ends torchrun and sends its files back; `stop job`
        when the user stopped the job, so the nodes drop its workdir), then EOF, then the ssh
        sessions killed."""
        self._send(b"stop job\n" if self.stop_asked else b"stop\n")
        deadline = time.monotonic() + grace_s + 5.0
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            self._drain()
            time.sleep(0.2)
        self.closing.set()
        with self.write_lock:
            for p in self.procs:
                with contextlib.suppress(OSError, ValueError):
                    if p.stdin is not None:
                        p.stdin.close()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.kill()
        for r in self.readers:
            r.join(timeout=5)
        self._drain()

    def close(self) -> None:
        """The hosts' shared connections end with the run (not ControlPersist later)."""
        self.closing.set()
        for h in self.hosts:
            argv = ["ssh", *ssh_conn.options(h, self.known_hosts, self.control_dir),
                    "-O", "exit", h.target]
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(argv, capture_output=True, timeout=10)


def _first(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0])
    driver = Driver(json.loads(path.read_text()), path)

    driver.catch_stop()
    try:
        code = driver.run()
        driver.release_spares(code)
        return code
    finally:
        driver.close()


if __name__ == "__main__":
    sys.exit(main())
