"""`admission.admit`: one pure pass that decides whether a job may run on a cluster, asked
for or held, and returns what it decided (layout, first world, cluster, devices) or the one
refusal, with the texts the CLI shows. No store, no files: the facts come in as data."""

from __future__ import annotations

from pathlib import Path

from gpufleet.errors import ConflictError, SpecError
from gpufleet.lifecycle.admission import Admitted, Facts, Refused, Target, admit, of_spec
from gpufleet.pool.model import Device, Placement
from gpufleet.spec import ClusterSpec, JobSpec

HERE = Path(__file__).resolve()
HELD = (Placement("n0", "127.0.0.1", tuple(
    Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0) for i in range(4))),)


def _spec(**extra: object) -> JobSpec:
    return JobSpec.parse({"name": "j", "script": HERE.name, "workdir": str(HERE.parent),
                          "cluster": "c", **extra})


def _target(count: int = 4, nodes: int = 1, kind: str | None = "local") -> Target:
    return Target("c", "cpu", count, nodes, kind, HELD)


def _refusal(decision: Admitted | Refused) -> str:
    assert isinstance(decision, Refused), decision
    return str(decision.error)


def test_an_admitted_job_carries_its_layout_world_and_devices() -> None:
    got = admit(_spec(), _target(), Facts())
    assert isinstance(got, Admitted)
    assert (got.world, got.cluster, got.placements) == (4, "c", HELD)
    assert got.layout.dp == 4
    two = admit(_spec(workers_per_node=2), _target(), Facts())
    assert isinstance(two, Admitted) and (two.world, two.layout.dp) == (2, 2)


def test_the_same_refusals_with_the_same_texts() -> None:
    assert "4 workers per node need as many devices, but cluster c has 2 per node" in _refusal(
        admit(_spec(workers_per_node=4), _target(count=2), Facts()))
    assert "a simulated pool only plans" in _refusal(admit(_spec(), _target(kind="sim"), Facts()))
    assert _refusal(admit(_spec(), _target(), Facts(name_taken=True))) == (
        "name: a job named 'j' already exists; pick another name")
    assert _refusal(admit(_spec(), _target(), Facts(busy_with="other"))) == (
        "cluster: 'c' is busy with job 'other'; wait for it, stop it (gpufleet stop other) or "
        "use another cluster")
    assert "needs at least 3 device(s); cluster c has 2" in _refusal(
        admit(_spec(workers="3:6"), _target(count=2), Facts()))


def test_refusals_are_the_errors_the_cli_prints_as_one_line() -> None:
    busy = admit(_spec(), _target(), Facts(busy_with="other"))
    bad = admit(_spec(workers_per_node=8), _target(), Facts())
    assert isinstance(busy, Refused) and isinstance(busy.error, ConflictError)
    assert isinstance(bad, Refused) and isinstance(bad.error, SpecError)


def test_checks_run_in_the_order_a_user_fixes_them() -> None:
    """Several problems at once: the one reported is the first a user would fix."""
    everything = Facts(name_taken=True, busy_with="other")
    assert "workers per node" in _refusal(admit(_spec(workers_per_node=8), _target(), everything))
    assert "already exists" in _refusal(admit(_spec(), _target(), everything))


def test_the_pass_after_a_grant_judges_what_was_granted() -> None:
    """Asked: 8 devices on 2 nodes (4 per node); a pool that granted them on 4 nodes (2 per
    node) cannot run 4 workers per node, and the second pass says so."""
    spec = _spec(workers_per_node=4, framework="torchrun")
    asked = of_spec(ClusterSpec.parse({"name": "c", "gpu": "cpu", "count": 8, "nodes": 2,
                                       "backend": "ray", "pool": "p"}))
    assert (asked.nodes, asked.per_node) == (2, 4)
    assert isinstance(admit(spec, asked, Facts()), Admitted)
    granted = Target("c", "cpu", 8, 4, "ray")
    assert "cluster c has 2 per node" in _refusal(admit(spec, granted, Facts()))


def test_a_layout_problem_in_the_script_is_a_refusal() -> None:
    """The script's own defaults (read from its text, not run) are part of the decision."""
    source = "p.add_argument('--heads', type=int, default=3)\n"
    assert isinstance(admit(_spec(tp=2), _target(), Facts()), Admitted)  # shape unknown
    got = admit(_spec(tp=2), _target(), Facts(source=source))
    assert isinstance(got, Refused) and isinstance(got.error, SpecError)
    assert "heads" in str(got.error)
