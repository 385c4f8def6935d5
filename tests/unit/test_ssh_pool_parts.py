"""An SSH pool's pure parts: hostfile lines, what `pool add ssh` refuses before reaching a host,
what a probe's output makes of a node, and ssh's failures as one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.backends import ssh_keys, ssh_nodes, ssh_probe
from gpufleet.backends.adders import HostsAsk, ssh_hosts
from gpufleet.backends.kinds import capabilities
from gpufleet.backends.registry import addable, where
from gpufleet.backends.ssh_conn import Host, parse_hostfile
from gpufleet.errors import SpecError

DEFAULTS = Host(address="-", port=2222, user="alice", identity="/keys/id", python="python3")


def test_hostfile_lines_take_their_own_keys_else_the_defaults() -> None:
    text = ("# the lab\n\n10.0.0.1 slots=4\n"
            "gpu-b slots=8 gpu=H100 user=bob port=22 identity=/k/b python=/opt/py  # note\n")
    a, b = parse_hostfile(text, DEFAULTS)
    assert a == Host("10.0.0.1", 2222, "alice", "/keys/id", 4, None, "python3")
    assert b == Host("gpu-b", 22, "bob", "/k/b", 8, "H100", "/opt/py")
    assert b.target == "bob@gpu-b"


@pytest.mark.parametrize(("text", "said"), [
    ("a slots=2\nb slots\n", "hostfile line 2: 'slots' is not KEY=VALUE"),
    ("a cores=2\n", "hostfile line 1: unknown key 'cores'; allowed: slots, gpu, user"),
    ("a slots=0\n", "hostfile line 1: slots=0 is not allowed; allowed: a whole number >= 1"),
    ("a slots=x\n", "slots=x is not allowed"),
    ("a port=70000\n", "hostfile line 1: port=70000 is not allowed; allowed: 1-65535"),
    ("a\n\na\n", "hostfile line 3: host a is listed twice"),
    ("a;rm slots=1\n", "hostfile line 1: 'a;rm' is not a host name or an IP address"),
    ("a user=-oProxyCommand=x\n", "hostfile line 1: user='-oProxyCommand=x' is not a user"),
    ("# nothing\n", "hostfile: no hosts in it"),
])
def test_each_bad_hostfile_line_is_named_with_what_is_allowed(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_hostfile(text, DEFAULTS)
    assert said in str(caught.value)


def test_pool_add_ssh_refuses_before_reaching_a_host(tmp_path: Path) -> None:
    def refused(ask: HostsAsk, text: str | None = None) -> str:
        with pytest.raises(SpecError) as caught:
            ssh_hosts(ask, text)
        return str(caught.value)

    assert refused(HostsAsk()).startswith("host: give the machines as --host")
    assert refused(HostsAsk(["a"], hostfile=tmp_path / "h"), "a\n").startswith("host: give")
    assert "port: 0 is not allowed; allowed: 1-65535" in refused(HostsAsk(["a"], port=0))
    missing = tmp_path / "nokey"
    assert refused(HostsAsk(["a"], identity=missing)) == (
        f"identity: {missing} (for a) does not exist; give the path of a private key whose "
        ".pub is in the host's authorized_keys")
    assert refused(HostsAsk(hostfile=tmp_path / "h"), "a bogus\n").startswith(
        "hostfile: hostfile line 1: 'bogus' is not KEY=VALUE")
    assert refused(HostsAsk(["a"], user="-oProxyCommand=x")).startswith(
        "user: '-oProxyCommand=x' is not a user name")
    assert refused(HostsAsk(hostfile=tmp_path / "h"), "a gpu=H9000\n").startswith(
        "hostfile: gpu=H9000 of a: unknown GPU type 'H9000'")
    key = tmp_path / "id"
    key.write_text("not read\n")
    hosts = ssh_hosts(HostsAsk(["a", "b"], user="root", identity=key, port=22, python="py"),
                      None)
    assert [h.target for h in hosts] == ["root@a", "root@b"]
    assert {h.identity for h in hosts} == {str(key)}


def test_the_ssh_kind_is_a_registered_multi_node_engine() -> None:
    caps = capabilities("ssh")
    assert caps.multi_node and caps.ssh and not caps.allocates and not caps.this_host
    assert "ssh" in addable()
    assert where("ssh", None, json.dumps({"hosts": [{}, {}], "known_hosts": "k"})) == \
        "2 hosts over ssh"


def _probe(**over: object) -> str:
    data = {"cores": 4, "memory_bytes": 8 * 2**30, "gpus": [], "torch": "2.5.1",
            "gpufleet": "0.1.0", "executable": "/opt/py", "routes": {}}
    return "banner\n" + json.dumps({**data, **over}) + "\n"


def test_a_probe_makes_cpu_slots_from_the_hostfile_else_the_cores() -> None:
    node = ssh_nodes.node_of(Host("10.0.0.1"), _probe(), "0.1.0")
    assert node.healthy and node.state == "up" and node.id == node.address == "10.0.0.1"
    assert [d.id for d in node.devices] == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert node.devices[0].memory_bytes == 2 * 2**30 and node.inter_fabric == "ethernet"
    routed = _probe(routes={"10.0.0.2": {"dev": "eth1", "src": "10.0.0.1"}, "10.0.0.3": {}})
    assert ssh_nodes.node_of(Host("10.0.0.1"), routed, "0.1.0").state == "up via eth1"
    two = ssh_nodes.node_of(Host("10.0.0.1", slots=2), _probe(), "0.1.0")
    assert len(two.devices) == 2 and two.devices[0].memory_bytes == 4 * 2**30


def test_a_probe_names_gpus_by_the_catalog() -> None:
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 10**9}] * 2
    node = ssh_nodes.node_of(Host("g"), _probe(gpus=gpus), "0.1.0")
    assert [d.gpu for d in node.devices] == ["H100-SXM", "H100-SXM"]
    odd = ssh_nodes.node_of(Host("g"), _probe(gpus=[{"name": "Odd 1", "memory_bytes": 1}]),
                            "0.1.0")
    assert odd.devices[0].gpu == "unknown:Odd 1"
    declared = ssh_nodes.node_of(Host("g", gpu="a100"), _probe(gpus=gpus), "0.1.0")
    assert declared.devices[0].gpu.startswith("A100")


@pytest.mark.parametrize(("over", "state"), [
    ({"torch": None}, "no torch: /opt/py has no torch installed"),
    ({"gpufleet": None}, "no gpufleet: /opt/py has no gpufleet installed (want 0.1.0)"),
    ({"gpufleet": "0.2.0"}, "gpufleet 0.1.0 here, 0.2.0 on the node: install 0.1.0 there"),
])
def test_a_host_that_cannot_run_jobs_is_shown_unhealthy_with_why(
        over: dict[str, object], state: str) -> None:
    node = ssh_nodes.node_of(Host("h", slots=2), _probe(**over), "0.1.0")
    assert not node.healthy and node.state == state
    assert len(node.devices) == 2 and not any(d.healthy for d in node.devices)


def test_ssh_failures_are_one_line_each() -> None:
    host = Host("10.0.0.7", port=2222, identity="/k/id")
    kh = Path("/h/pools/lab/known_hosts")

    def why(code: int | None, err: str) -> str:
        return ssh_nodes.failure(host, code, err, kh, "lab", 10)

    assert why(None, "") == "unreachable: no answer from 10.0.0.7:2222 in 10 s"
    assert why(255, "root@10.0.0.7: Permission denied (publickey).\n") == (
        "key refused: host 10.0.0.7 refused the key /k/id: add /k/id.pub to its "
        "authorized_keys")
    changed = ("@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
               "The fingerprint for the ED25519 key sent by the remote host is\n"
               "SHA256:Bx+G4/dQ.\nHost key verification failed.\n")
    said = why(255, changed)
    assert said.startswith("host key changed: host 10.0.0.7's host key changed since pool "
                           "lab was added (it now shows SHA256:Bx+G4/dQ)")
    assert said.endswith(f"ssh-keygen -R '[10.0.0.7]:2222' -f {kh}") and "\n" not in said
    assert why(255, "ssh: connect to host 10.0.0.7 port 2222: No route to host\n") == (
        "unreachable: ssh: connect to host 10.0.0.7 port 2222: No route to host")
    assert why(127, "bash: line 1: python3: command not found\n").startswith(
        "no python: 'python3' is not on 10.0.0.7")
    node = ssh_nodes.unreachable(Host("u", slots=3), "unreachable: x")
    assert not node.healthy and node.state == "unreachable: x" and len(node.devices) == 3
    assert ssh_nodes.node_of(host, "garbage", "0.1.0").state.startswith("probe failed")


def test_host_key_fingerprints_and_scanned_lines() -> None:
    scanned = "# a:22 SSH-2.0-OpenSSH_9.2\na ssh-ed25519 AAAA\n\n[a]:2222 ssh-rsa BBBB\n"
    assert ssh_keys.key_lines(scanned) == ["a ssh-ed25519 AAAA", "[a]:2222 ssh-rsa BBBB"]
    keygen = ("256 SHA256:abc+/= a (ED25519)\n3072 SHA256:def [a]:2222 (RSA)\n")
    assert ssh_keys.fingerprints(keygen) == ["SHA256:abc+/= (ED25519)", "SHA256:def (RSA)"]
    assert ssh_keys.scan_argv(Host("a", port=2222)) == ["ssh-keyscan", "-p", "2222", "-T", "5",
                                                        "a"]


def test_the_probe_reads_nvidia_smi_and_routes() -> None:
    assert ssh_probe.parse_smi("NVIDIA A100-SXM4-80GB, 81920\nbad line\n") == [
        {"name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 81920 * 2**20}]
    assert ssh_probe.parse_route("169.254.1.2 dev eth0 src 169.254.1.1 uid 0 \\    cache ") \
        == {"dev": "eth0", "src": "169.254.1.1"}
    here = ssh_probe.probe([])
    assert isinstance(here["cores"], int) and here["cores"] >= 1


def test_doctor_reach_is_one_check_per_address_with_the_fix() -> None:
    from gpufleet.backends.base import Reach
    from gpufleet.doctor.reach import reach_checks

    found = [Reach("10.0.0.2", 22, True, "eth0", "10.0.0.1"),
             Reach("10.0.0.9", 4000, False, "eth0", "10.0.0.1", "Connection refused"),
             Reach("192.0.2.1", 22, False, "", "", "Network is unreachable")]
    ok, refused, no_route = reach_checks("n1", found, {("10.0.0.9", 4000): "the submitter"})
    assert (ok.status, ok.detail) == ("pass", "reaches 10.0.0.2:22 (10.0.0.2:22) over eth0 "
                                              "from 10.0.0.1")
    assert refused.status == "fail" and refused.detail == (
        "cannot reach the submitter (10.0.0.9:4000) over eth0 from 10.0.0.1: Connection refused")
    assert "check the firewall on 10.0.0.9 and on eth0" in refused.fix
    assert no_route.fix.startswith("no route from n1 to 192.0.2.1")


def test_each_kind_refuses_the_others_options_before_anything_happens(tmp_path: Path) -> None:
    from gpufleet.backends import adders

    claimed: list[str] = []

    def request(**over: object) -> adders.AddRequest:
        base: dict[str, object] = dict(name="p", address=None, shapes=[], token_file=None,
                                       partition=None, account=None, home=tmp_path,
                                       claim=lambda: claimed.append("p"))
        return adders.AddRequest(**{**base, **over})  # type: ignore[arg-type]

    with pytest.raises(SpecError, match="host: --host is for an ssh pool, not a sim pool"):
        adders.add_sim(request(shapes=["2xH100:8"], ssh=HostsAsk(["a"])))
    with pytest.raises(SpecError, match="address: an ssh pool takes --host/--hostfile"):
        adders.add_ssh(request(address="a:1", ssh=HostsAsk(["a"])))
    with pytest.raises(SpecError, match="hostfile: cannot read"):
        adders.add_ssh(request(ssh=HostsAsk(hostfile=tmp_path / "absent")))
    assert claimed == [] and not (tmp_path / "pools").exists()
