"""ClusterSpec / JobSpec validation: every rule, each error naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError, SpecError
from gpufleet.script_file import parse_job_here, script_problems
from gpufleet.spec import ClusterSpec, JobSpec, load_yaml, parse_disk


def problems_of(data: dict, model: type = ClusterSpec) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        model.parse(data)
    return info.value.problems


def fields_of(data: dict, model: type = ClusterSpec) -> set[str]:
    return {field for field, _ in problems_of(data, model)}


def only_problem(data: dict, field: str, model: type = ClusterSpec) -> str:
    """The message of the single problem on `field` (fails if there are none or several)."""
    msgs = [msg for f, msg in problems_of(data, model) if f == field]
    assert len(msgs) == 1, msgs
    return msgs[0]


# ---------------------------------------------------------------- ClusterSpec: valid specs


@pytest.mark.parametrize(
    ("typed", "resolved"),
    [
        ("h100", "H100-SXM"),
        ("H100", "H100-SXM"),
        ("rtx 4090", "RTX4090"),
        ("RTX-3090", "RTX3090"),
        ("3090", "RTX3090"),
        ("A100", "A100-80GB"),  # plain 'A100' is the 80 GB part (catalog note)
        ("a100-40g", "A100-40GB"),
        ("h100 pcie", "H100-PCIe"),
        ("H200", "H200"),
        ("cpu", "cpu"),
    ],
)
def test_gpu_aliases_resolve_to_catalog_names(typed: str, resolved: str) -> None:
    assert ClusterSpec.parse({"gpu": typed}).gpu == resolved


def test_same_type_written_two_ways_is_not_mixed() -> None:
    assert ClusterSpec.parse({"gpu": ["h100", "H100-SXM"], "count": 2}).gpu == "H100-SXM"
    assert ClusterSpec.parse({"gpu": "h100,H100"}).gpu == "H100-SXM"


def test_valid_single_node_spec_and_derived_properties() -> None:
    spec = ClusterSpec.parse({"name": "llama", "gpu": "h100", "count": 8, "network": "nvswitch",
                              "disk": "2TB"})
    assert (spec.name, spec.gpu, spec.count, spec.network) == ("llama", "H100-SXM", 8, "nvswitch")
    assert spec.node_count == 1
    assert spec.per_node == 8
    assert spec.fabric == "nvswitch"
    assert spec.disk_bytes == 2 * 10**12


def test_defaults() -> None:
    spec = ClusterSpec.parse({"gpu": "cpu"})
    assert spec.count == 1
    assert spec.backend == "local"
    assert spec.fabric == "pcie"  # one node, no network named
    assert spec.disk_bytes == 10**9  # DEFAULT_DISK = "1GB"


def test_none_values_are_treated_as_absent() -> None:
    # the CLI passes every flag, unset ones as None
    spec = ClusterSpec.parse({"gpu": "cpu", "count": 2, "name": None, "network": None, "nodes": None})
    assert spec.count == 2
    assert spec.name is None


def test_eight_per_node_is_the_limit_on_local() -> None:
    assert ClusterSpec.parse({"gpu": "cpu", "count": 8}).per_node == 8


@pytest.mark.parametrize("book", ["marketplace", "hyperscaler"])
def test_known_price_book_accepted(book: str) -> None:
    assert ClusterSpec.parse({"gpu": "cpu", "price_book": book}).price_book == book


# ---------------------------------------------------------------- ClusterSpec: GPU rules


def test_unknown_gpu_names_field_and_suggests() -> None:
    msg = only_problem({"gpu": "h1000"}, "gpu")
    assert "unknown GPU type 'h1000'" in msg
    assert "did you mean 'H100-SXM'" in msg
    assert "known:" in msg and "RTX4090" in msg


def test_unknown_gpu_far_from_anything_lists_known_types() -> None:
    msg = only_problem({"gpu": "zzzzzzzz"}, "gpu")
    assert "unknown GPU type 'zzzzzzzz'" in msg
    assert "H100-SXM" in msg and "cpu" in msg


@pytest.mark.parametrize("gpu", ["H100,A100", "h100+rtx4090", ["H100", "A100"], ["rtx3090", "rtx4090"]])
def test_mixed_gpu_types_refused(gpu: str | list[str]) -> None:
    msg = only_problem({"gpu": gpu, "count": 2}, "gpu")
    assert "mixed GPU types are refused" in msg


def test_mixed_message_names_both_types() -> None:
    msg = only_problem({"gpu": "H100,A100"}, "gpu")
    assert "A100-80GB" in msg and "H100-SXM" in msg


def test_empty_gpu_refused() -> None:
    assert "required" in only_problem({"gpu": ""}, "gpu")


def test_missing_gpu_field_refused() -> None:
    assert "gpu" in fields_of({"count": 2})


# ---------------------------------------------------------------- ClusterSpec: count and nodes


@pytest.mark.parametrize("count", [0, -1])
def test_count_below_one_refused(count: int) -> None:
    msg = only_problem({"gpu": "cpu", "count": count}, "count")
    assert f"got {count}" in msg
    assert "at least 1" in msg
    assert "1 to 128" in msg


def test_count_above_128_refused() -> None:
    msg = only_problem({"gpu": "cpu", "count": 129}, "count")
    assert "got 129" in msg
    assert "at most 128" in msg


def test_more_than_eight_per_node_on_local_refused() -> None:
    msg = only_problem({"gpu": "H100", "count": 16}, "count")
    assert "at most 8 GPUs per node" in msg
    assert "--nodes 2" in msg  # ceil(16 / 8)
    assert "local backend has one node" in msg


def test_cpu_slots_on_this_host_are_not_gpus_per_node() -> None:
    """This host offers as many CPU slots as --cpu-slots says (up to 128): the spec cannot know
    how many, so it leaves the count to the allocation, which says what the host offers."""
    spec = ClusterSpec.parse({"gpu": "cpu", "count": 16})
    assert (spec.node_count, spec.per_node) == (1, 16)
    # a pool of CPU nodes (Ray) keeps the rule for each of its nodes
    msg = only_problem({"gpu": "cpu", "count": 16, "nodes": 1, "backend": "ray"}, "count")
    assert "at most 8 GPUs per node" in msg and "--nodes 2" in msg


def test_nine_gpus_need_two_nodes() -> None:
    assert "--nodes 2" in only_problem({"gpu": "A100", "count": 9}, "count")  # ceil(9 / 8) == 2


def test_nodes_not_dividing_count_refused() -> None:
    msgs = [m for f, m in problems_of({"gpu": "cpu", "count": 12, "nodes": 5}) if f == "nodes"]
    assert any("12 GPUs cannot be split evenly over 5 nodes" in m for m in msgs)


def test_several_nodes_need_a_multi_node_backend() -> None:
    msgs = [m for f, m in problems_of({"gpu": "cpu", "count": 16, "nodes": 2}) if f == "nodes"]
    assert any("local backend has one node" in m for m in msgs)


def test_nvswitch_across_nodes_refused() -> None:
    msg = only_problem({"gpu": "h100", "count": 16, "nodes": 2, "network": "nvswitch"}, "network")
    assert "nvswitch connects GPUs within one node" in msg
    assert "infiniband, ethernet" in msg


@pytest.mark.parametrize("network", ["pcie", "nvlink"])
def test_intra_node_networks_across_nodes_refused(network: str) -> None:
    msg = only_problem({"gpu": "h100", "count": 16, "nodes": 2, "network": network}, "network")
    assert f"{network} does not span nodes" in msg
    assert "infiniband, ethernet" in msg


@pytest.mark.parametrize("network", ["infiniband", "ethernet"])
def test_inter_node_networks_not_refused_as_network(network: str) -> None:
    # on the local backend these still fail on `nodes`, but never on `network`
    assert "network" not in fields_of({"gpu": "h100", "count": 16, "nodes": 2, "network": network})


def test_unknown_network_lists_allowed() -> None:
    msg = only_problem({"gpu": "cpu", "network": "token-ring"}, "network")
    assert "'token-ring' is not allowed" in msg
    for allowed in ("pcie", "nvlink", "nvswitch", "infiniband", "ethernet"):
        assert allowed in msg


def test_unknown_backend_refused() -> None:
    msg = only_problem({"gpu": "cpu", "backend": "kubernetes"}, "backend")
    assert "'kubernetes' is not allowed; allowed: 'local', 'ray', 'sim', 'slurm' or 'ssh'" in msg


def test_unknown_price_book_refused_with_allowed() -> None:
    msg = only_problem({"gpu": "cpu", "price_book": "cheapo"}, "price_book")
    assert "unknown price book 'cheapo'" in msg
    assert "marketplace" in msg and "hyperscaler" in msg


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a", "llama", "llama-7b", "x9", "a" * 40, "a" + "-" * 38 + "b"])
def test_good_names(name: str) -> None:
    assert ClusterSpec.parse({"gpu": "cpu", "name": name}).name == name


@pytest.mark.parametrize(
    "name",
    ["Llama", "LLAMA", "my_cluster", "1llama", "-llama", "llama-", "a" * 41, "has space", "dot.name", "é"],
)
def test_bad_names_refused(name: str) -> None:
    msg = only_problem({"gpu": "cpu", "name": name}, "name")
    assert "not a valid cluster name" in msg
    assert "1-40" in msg


def test_name_with_trailing_newline_refused() -> None:
    assert "name" in fields_of({"gpu": "cpu", "name": "llama\n"})


# ---------------------------------------------------------------- disk sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1TB", 10**12),
        ("500GiB", 500 * 2**30),
        ("100", 100 * 10**9),  # a bare number means GB
        (100, 100 * 10**9),
        ("100GB", 100 * 10**9),
        ("100G", 100 * 10**9),
        ("1.5TB", 15 * 10**11),
        ("2 tib", 2 * 2**40),
        ("512MB", 512 * 10**6),
        ("4KiB", 4 * 2**10),
        ("1PB", 10**15),
        (" 10 GB ", 10 * 10**9),
    ],
)
def test_parse_disk(text: str | int, expected: int) -> None:
    assert parse_disk(text) == expected


def test_disk_bytes_on_spec() -> None:
    assert ClusterSpec.parse({"gpu": "cpu", "disk": "1TB"}).disk_bytes == 10**12
    assert ClusterSpec.parse({"gpu": "cpu", "disk": "500GiB"}).disk_bytes == 500 * 2**30
    assert ClusterSpec.parse({"gpu": "cpu", "disk": "100"}).disk_bytes == 100 * 10**9


@pytest.mark.parametrize("text", ["lots", "", "GB", "-1GB", "1XB", "5iB", "1.2.3GB", "1 0GB", "1e3GB"])
def test_bad_disk_sizes_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_disk(text)
    msg = only_problem({"gpu": "cpu", "disk": text}, "disk")
    assert "is not a size" in msg


def test_disk_in_plain_bytes_is_not_gigabytes() -> None:
    try:
        value: int | None = parse_disk("100B")
    except ValueError:
        value = None
    assert value in (None, 100)


# ---------------------------------------------------------------- unknown fields, problems together


def test_unknown_field_refused() -> None:
    assert only_problem({"gpu": "cpu", "colour": "red"}, "colour") == "unknown field"


def test_several_problems_reported_together() -> None:
    data = {"gpu": "nope", "count": 0, "name": "Bad_Name", "disk": "lots", "colour": "red"}
    with pytest.raises(SpecError) as info:
        ClusterSpec.parse(data)
    err = info.value
    assert {f for f, _ in err.problems} == {"gpu", "count", "name", "disk", "colour"}
    assert len(err.problems) == 5
    # the message is every problem, each prefixed by its field
    for field, msg in err.problems:
        assert f"{field}: {msg}" in str(err)
    assert isinstance(err, GpufleetError)
    assert err.exit_code == 2


def test_several_cross_field_problems_reported_together() -> None:
    fields = [f for f, _ in problems_of({"gpu": "h100", "count": 12, "nodes": 5, "network": "nvswitch"})]
    # uneven split, nvswitch over nodes, and nodes on the local backend
    assert fields.count("nodes") == 2
    assert fields.count("network") == 1


def test_field_and_cross_field_problems_reported_together() -> None:
    assert fields_of({"gpu": "H100", "count": 16, "name": "Bad"}) == {"name", "count"}


# ---------------------------------------------------------------- JobSpec


@pytest.fixture
def script(tmp_path: Path) -> str:
    p = tmp_path / "train.py"
    p.write_text("print('hi')\n")
    return str(p)


def test_job_valid(script: str) -> None:
    spec = JobSpec.parse({"script": script, "args": ["--epochs", "3"], "name": "run-1",
                          "cluster": "llama", "env": {"NCCL_DEBUG": "INFO"}, "max_restarts": 2})
    assert spec.script == script
    assert spec.args == ["--epochs", "3"]
    assert spec.cluster == "llama"
    assert spec.env == {"NCCL_DEBUG": "INFO"}
    assert (spec.strategy, spec.precision, spec.framework) == ("ddp", "fp32", "torchrun")


def test_job_inline_cluster_becomes_cluster_spec(script: str) -> None:
    spec = JobSpec.parse({"script": script, "cluster": {"gpu": "rtx 4090", "count": 2}})
    assert isinstance(spec.cluster, ClusterSpec)
    assert (spec.cluster.gpu, spec.cluster.count) == ("RTX4090", 2)


def test_job_unknown_strategy_lists_allowed(script: str) -> None:
    msg = only_problem({"script": script, "strategy": "zero4"}, "strategy", JobSpec)
    assert "'zero4' is not allowed" in msg
    assert "allowed: 'ddp'" in msg and "'zero3'" in msg and "'pp'" in msg


def test_job_unknown_precision_and_framework(script: str) -> None:
    fields = fields_of({"script": script, "precision": "fp8", "framework": "mpi"}, JobSpec)
    assert fields == {"precision", "framework"}


@pytest.mark.parametrize("bad", ["1BAD", "A-B", "WITH SPACE", "", "É"])
def test_job_env_names_validated(script: str, bad: str) -> None:
    msg = only_problem({"script": script, "env": {"GOOD_1": "x", bad: "y"}}, "env", JobSpec)
    assert "invalid variable name" in msg
    assert "GOOD_1" not in msg


def test_job_env_lists_every_bad_name(script: str) -> None:
    msg = only_problem({"script": script, "env": {"1BAD": "x", "A-B": "y"}}, "env", JobSpec)
    assert "1BAD" in msg and "A-B" in msg


@pytest.mark.parametrize("good", ["_X", "x", "NCCL_P2P_LEVEL", "a1"])
def test_job_env_good_names(script: str, good: str) -> None:
    assert JobSpec.parse({"script": script, "env": {good: "1"}}).env == {good: "1"}


def test_job_env_name_with_newline_refused(script: str) -> None:
    assert "env" in fields_of({"script": script, "env": {"FOO\n": "1"}}, JobSpec)


def test_job_env_numeric_value_from_yaml_accepted(script: str) -> None:
    assert JobSpec.parse({"script": script, "env": {"OMP_NUM_THREADS": 4}}).env == {"OMP_NUM_THREADS": "4"}


def test_job_inline_cluster_errors_reported_under_cluster(script: str) -> None:
    msg = only_problem({"script": script, "cluster": {"gpu": "nope", "count": 0}}, "cluster", JobSpec)
    assert "gpu: unknown GPU type 'nope'" in msg
    assert "count: got 0" in msg


def test_job_bad_cluster_name(script: str) -> None:
    msg = only_problem({"script": script, "cluster": "Bad_Name"}, "cluster", JobSpec)
    assert "not a valid cluster name" in msg


def test_job_bad_job_name(script: str) -> None:
    assert "not a valid job name" in only_problem({"script": script, "name": "-x"}, "name", JobSpec)


class _JobHere:
    """JobSpec as the edges that take a job parse it: the script looked for on disk."""

    parse = staticmethod(parse_job_here)


def test_job_missing_script_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    assert only_problem({"script": str(missing)}, "script", _JobHere) == f"no such file: {missing}"


def test_job_script_that_is_a_folder_refused(tmp_path: Path) -> None:
    msg = only_problem({"script": str(tmp_path)}, "script", _JobHere)
    assert msg == f"{tmp_path} is a directory, not a script"
    # relative to the job's own folder, as the script itself is
    (tmp_path / "src").mkdir()
    assert only_problem({"script": "src", "workdir": str(tmp_path)}, "script", _JobHere) == \
        "src is a directory, not a script"


def test_job_parse_reads_no_file(tmp_path: Path) -> None:
    """Validation is of data only: a script that is nowhere is not JobSpec.parse's concern, and
    what an edge found on disk is reported with the data's own problems, each once."""
    assert JobSpec.parse({"script": str(tmp_path / "nope.py")}).script == str(tmp_path / "nope.py")
    assert script_problems({"script": "train.py", "workdir": str(tmp_path)}) == [
        ("script", "no such file: train.py")]
    (tmp_path / "train.py").write_text("")
    assert script_problems({"script": "train.py", "workdir": str(tmp_path)}) == []
    found = [("script", "no such file: x.py")]
    assert problems_of({"script": "x.py", "strategy": "megatron"}, _JobHere) == [
        ("strategy", "'megatron' is not allowed; allowed: 'ddp', 'fsdp', 'zero1', 'zero2', "
                     "'zero3', 'tp' or 'pp'"), *found]
    with pytest.raises(SpecError) as info:
        JobSpec.parse({"script": "x.py", "workers": "2:4", "framework": "deepspeed"}, found=found)
    assert info.value.problems == [*found, ("workers", "elastic ranges run under torchrun only, "
                                            "not deepspeed; drop --workers or use --framework torchrun")]


def test_job_blank_script_refused() -> None:
    assert "script path is required" in only_problem({"script": "  "}, "script", JobSpec)


def test_job_unknown_field_and_limits(script: str) -> None:
    problems = dict(problems_of({"script": script, "gpus": 2, "workers_per_node": 9,
                                 "max_restarts": -1}, JobSpec))
    assert problems["gpus"] == "unknown field"
    assert "at most 8" in problems["workers_per_node"]
    assert "at least 0" in problems["max_restarts"]


# ---------------------------------------------------------------- load_yaml


def test_load_yaml_reads_mapping(tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("script: train.py\nargs: ['--lr', '0.1']\ncluster:\n  gpu: h100\n  count: 8\n")
    assert load_yaml(p) == {"script": "train.py", "args": ["--lr", "0.1"],
                            "cluster": {"gpu": "h100", "count": 8}}


def test_load_yaml_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "absent.yaml"
    with pytest.raises(SpecError) as info:
        load_yaml(p)
    assert info.value.problems == [("file", f"no such file: {p}")]


@pytest.mark.parametrize(("text", "said"), [
    # the flow sequence opened on line 1 runs into line 2's mapping
    ("gpu: [h100\ncount: 8\n", "line 2, column 6: expected ',' or ']', but got ':' "
     "(in a flow sequence that starts at line 1, column 6)"),
    ("gpu: cpu\n  count: 1\n", "line 2, column 8: mapping values are not allowed here"),
    ("gpu: cpu\nname: 'dev\n", "line 3, column 1: found unexpected end of stream "
     "(in a quoted scalar that starts at line 2, column 7)"),
    ("gpu: cpu\n\tcount: 1\n", "line 2, column 1: found character '\\t' that cannot start any token"),
])
def test_load_yaml_invalid_yaml_says_where(tmp_path: Path, text: str, said: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as info:
        load_yaml(p)
    assert info.value.problems == [("file", f"{p} is not valid YAML: {said}")]


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n", ""])
def test_load_yaml_not_a_mapping(tmp_path: Path, text: str) -> None:
    p = tmp_path / "list.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as info:
        load_yaml(p)
    assert info.value.problems == [("file", f"{p} must hold a mapping of fields")]
