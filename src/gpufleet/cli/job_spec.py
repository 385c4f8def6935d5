"""`gpufleet run`'s job spec from its YAML file and flags (flags win): one place that builds
the validated `JobSpec` the CLI hands to `submit`, kept out of the command's long signature."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.cli.app import store
from gpufleet.errors import SpecError

if TYPE_CHECKING:
    from gpufleet.spec import JobSpec
    from gpufleet.store import Store


def job_data(file: Path | None, script: str | None, args: list[str], env: list[str],
             flags: dict[str, Any], inline: dict[str, Any], cluster: str | None) -> dict[str, Any]:
    """The job as data from the YAML file and the flags (flags win), before validation: what
    goes to a server, which checks it against its own store."""
    from gpufleet.cli.env_pairs import merged_env
    from gpufleet.spec import load_yaml

    data: dict[str, Any] = load_yaml(file) if file else {}
    if script is not None:
        data["script"] = script
    if args:
        data["args"] = args
    env_pairs = merged_env(data.get("env"), env)
    data.update({k: v for k, v in {**flags, "env": env_pairs}.items() if v is not None})
    if any(v is not None for v in inline.values()):
        if cluster:
            raise SpecError([("cluster", "give either --cluster NAME or --gpu/--count for a new "
                              "cluster, not both")])
        given = data.get("cluster")
        base: dict[str, Any] = given if isinstance(given, dict) else {}
        data["cluster"] = {**base, **{k: v for k, v in inline.items() if v is not None}}
    elif cluster:
        data["cluster"] = cluster
    if "script" not in data:
        raise SpecError([("script", "give a script to run, e.g. gpufleet run examples/gpt.py "
                          "--gpu cpu --count 2")])
    data.setdefault("workdir", str(Path.cwd()))
    if data.get("cluster") is None:
        raise SpecError([("cluster", "give --cluster NAME, or --gpu and --count for a new cluster")])
    return data


def job_spec(file: Path | None, script: str | None, args: list[str], env: list[str],
             flags: dict[str, Any], inline: dict[str, Any],
             cluster: str | None) -> tuple[Store, JobSpec]:
    """The job spec from the YAML file and the flags (flags win), its script looked for on disk;
    the store, opened when a new cluster's pool must be resolved."""
    from gpufleet.lifecycle.provision import with_pool
    from gpufleet.script_file import parse_job_here

    data = job_data(file, script, args, env, flags, inline, cluster)
    st = store()
    if isinstance(data["cluster"], dict):
        data["cluster"] = with_pool(st, data["cluster"])
    return st, parse_job_here(data)
