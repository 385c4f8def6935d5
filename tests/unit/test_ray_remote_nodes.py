"""What a Ray pool whose nodes are other machines needs from the driver and the node agent:
Pythons compared by major.minor and a version mismatch said in one line (pure pieces; the
run is tests/integration/test_ray_machines.py; the workers' interface is node_net's,
tests/unit/test_node_net.py)."""

from __future__ import annotations

from gpufleet.backends.ray import MATCH_LEVEL_ENV, init_error_line, version_env

MISMATCH = """Version mismatch: The cluster was started with:
    Ray: 2.60.0
    Python: 3.10.1
This process on node 169.254.9.1 was started with:
    Ray: 2.60.0
    Python: 3.11.7
"""


def test_the_driver_compares_pythons_by_minor_unless_the_user_chose() -> None:
    assert version_env({}) == {MATCH_LEVEL_ENV: "minor"}
    assert version_env({MATCH_LEVEL_ENV: "patch"}) == {}


def test_a_version_mismatch_is_one_line_with_both_sides() -> None:
    line = init_error_line("169.254.9.1:6379", MISMATCH, "(hint)")
    assert "\n" not in line and "(hint)" not in line
    assert line.startswith("pool: the Ray cluster at 169.254.9.1:6379 runs Ray: 2.60.0, "
                           "Python: 3.10.1; this machine has Ray: 2.60.0, Python: 3.11.7")
    assert "major.minor" in line


def test_other_failures_keep_their_first_line_and_the_hint() -> None:
    assert init_error_line("h:1", "Connection refused\nmore", "(hint)") == \
        "pool: cannot reach the Ray cluster at h:1: Connection refused (hint)"
