"""The node side of SSH runs, pure parts: paths mapped both ways (the files it sends back:
test_files_back.py)."""

from gpufleet.backends import ssh_node

PAIRS = [("/home/ann/.gpufleet/jobs/j1", "/root/.cache/gpufleet/jobs/j1"),
         ("/home/ann/proj", "/root/.cache/gpufleet/workdirs/abc"),
         ("/home/ann/.venv/lib/gpufleet", "/opt/node/gpufleet")]


def test_submitter_paths_become_the_nodes_in_argv_env_and_folder() -> None:
    entry = {"argv": ["{python}", "-m", "torch.distributed.run", "--log-dir",
                      "/home/ann/.gpufleet/jobs/j1/torchrun", "/home/ann/proj/train.py",
                      "--data=/home/ann/proj/data", "/home/ann/projects/other.py"],
             "env": {"PYTHONPATH": "/home/ann/.venv/lib/gpufleet/bootstrap/site:/home/ann/proj",
                     "GPUFLEET_JOB_DIR": "/home/ann/.gpufleet/jobs/j1", "X": "proj"},
             "cwd": "/home/ann/proj"}
    argv, env, cwd = ssh_node.map_entry(entry, PAIRS)
    assert argv[4] == "/root/.cache/gpufleet/jobs/j1/torchrun"
    assert argv[5] == "/root/.cache/gpufleet/workdirs/abc/train.py"
    assert argv[6] == "--data=/root/.cache/gpufleet/workdirs/abc/data"
    assert argv[7] == "/home/ann/projects/other.py"  # a longer name is not the workdir
    assert env["PYTHONPATH"] == ("/opt/node/gpufleet/bootstrap/site:"
                                 "/root/.cache/gpufleet/workdirs/abc")
    assert env["GPUFLEET_JOB_DIR"] == "/root/.cache/gpufleet/jobs/j1"
    assert env["X"] == "proj"
    assert cwd == "/root/.cache/gpufleet/workdirs/abc"


def test_node_paths_in_lines_read_as_the_submitters() -> None:
    back = [(b, a) for a, b in PAIRS]
    line = "  error_file: /root/.cache/gpufleet/jobs/j1/torchrun/r_x/attempt_0/1/error.json"
    assert ssh_node._unmap_line(line, back) == (
        "  error_file: /home/ann/.gpufleet/jobs/j1/torchrun/r_x/attempt_0/1/error.json")
