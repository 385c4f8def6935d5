"""The test image of `scripts/test-image`, for every test that runs a job in a container.

`.ci/run` and `scripts/check` build it once (`scripts/test-image build`, offline: a Debian
rootfs with python3 and the .venv's torch, no gpufleet), load it into the test machines' own
image stores (`scripts/test-image load DIR`) and export its name as $GPUFLEET_TEST_IMAGE, with
$CONTAINERS_CONF naming the test-only podman settings (scripts/test-image.d/containers.conf:
runc and explicit ulimits, what this host kind needs). Without them a test is skipped, and under
CI=true it fails: CI must run these tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-image"


def image_or_skip() -> str:
    """The test image's name, as `--image` takes it; without it (or without podman, or its
    settings) the test is skipped (failed under CI=true)."""
    name = os.environ.get("GPUFLEET_TEST_IMAGE", "")
    why = ""
    if not name:
        why = ("no test image: $GPUFLEET_TEST_IMAGE is not set (as root: export "
               "GPUFLEET_TEST_IMAGE=$(scripts/test-image build) "
               "CONTAINERS_CONF=$(scripts/test-image conf))")
    elif shutil.which("podman") is None:
        why = "podman is missing (apt-get install podman runc)"
    elif not os.environ.get("CONTAINERS_CONF"):
        why = "$CONTAINERS_CONF is not set (export CONTAINERS_CONF=$(scripts/test-image conf))"
    elif subprocess.run(["podman", "image", "exists", name], capture_output=True,
                        timeout=120).returncode != 0:
        why = f"the test image {name} is not in this host's store (scripts/test-image build)"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the test image: {why}")
        pytest.skip(why)
    return name
