"""A pool's Ray token: where it is kept, who may read it, which environment a pool's processes
get, where `pool add` finds a token, and what a failed `ray start` is reported as."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpufleet.backends import ray_auth
from gpufleet.backends.ray_local import error_line
from gpufleet.errors import SpecError


def test_a_new_token_is_random_hex_and_owner_only(tmp_path: Path) -> None:
    path = ray_auth.pool_token_path(tmp_path / "home", "lab")
    ray_auth.new_token(path)
    first = path.read_text()
    assert path == tmp_path / "home" / "pools" / "lab" / ray_auth.TOKEN_FILE
    assert len(first) == 64 and int(first, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    ray_auth.new_token(path)  # again (a pool name reused): a different token, still private
    assert path.read_text() != first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_forget_removes_the_token_and_its_empty_folder(tmp_path: Path) -> None:
    path = ray_auth.new_token(ray_auth.pool_token_path(tmp_path, "lab"))
    ray_auth.forget(path)
    assert not path.parent.exists()
    ray_auth.forget(path)  # twice is harmless


def test_forget_keeps_other_files_of_the_pool(tmp_path: Path) -> None:
    path = ray_auth.new_token(ray_auth.pool_token_path(tmp_path, "lab"))
    (path.parent / "notes").write_text("x")
    ray_auth.forget(path)
    assert not path.exists() and (path.parent / "notes").exists()


def test_auth_env_points_at_the_pool_token_and_drops_the_users() -> None:
    user = {"PATH": "/bin", "RAY_AUTH_TOKEN": "someone-elses", "RAY_AUTH_TOKEN_PATH": "/x",
            "RAY_AUTH_MODE": "disabled"}
    env = ray_auth.auth_env(user, Path("/state/pools/lab/ray-auth-token"))
    assert env == {"PATH": "/bin", "RAY_AUTH_MODE": "token",
                   "RAY_AUTH_TOKEN_PATH": "/state/pools/lab/ray-auth-token"}
    assert ray_auth.env_token_path(env) == Path("/state/pools/lab/ray-auth-token")
    assert user["RAY_AUTH_TOKEN"] == "someone-elses"  # the caller's mapping is left alone


def test_auth_env_without_a_token_turns_auth_off_whatever_the_user_set() -> None:
    env = ray_auth.auth_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t"}, None)
    assert env == {"RAY_AUTH_MODE": "disabled"}
    assert ray_auth.env_token_path(env) is None


def test_given_token_order_flag_then_rays_own(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("fromhome\n")
    flag = tmp_path / "flag"
    flag.write_text("fromflag\n")
    via_path = tmp_path / "via-path"
    via_path.write_text("frompath")
    env = {"RAY_AUTH_TOKEN": " fromenv ", "RAY_AUTH_TOKEN_PATH": str(via_path)}

    def got(token_file: Path | None, environ: dict[str, str]) -> tuple[str, str] | None:
        given = ray_auth.given_token(token_file, environ, home)
        return None if given is None else (given.token, given.source)

    assert got(flag, env) == ("fromflag", str(flag))
    assert got(None, env) == ("fromenv", "$RAY_AUTH_TOKEN")
    assert got(None, {"RAY_AUTH_TOKEN_PATH": str(via_path)}) == ("frompath", str(via_path))
    assert got(None, {}) == ("fromhome", str(home / ".ray" / "auth_token"))
    assert ray_auth.given_token(None, {}, tmp_path / "nobody") is None


@pytest.mark.parametrize(("content", "why"), [(None, "cannot read"), ("", "does not hold"),
                                              ("two words", "does not hold")])
def test_a_bad_token_file_is_one_field_error(tmp_path: Path, content: str | None,
                                             why: str) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SpecError) as caught:
        ray_auth.given_token(path, {}, tmp_path)
    assert caught.value.problems[0][0] == "token_file"
    assert why in str(caught.value)


# What `ray start` printed on a machine without a token (shortened): INFO lines, a traceback,
# and the exception last but one line before Ray's closing INFO line.
RAY_START_NO_TOKEN = """\
2026-12-01 06:26:40,369\tINFO scripts.py:1043 -- Local node IP: 127.0.43.1
Traceback (most recent call last):
  File ".../ray/scripts/scripts.py", line 1072, in start
    ensure_token_if_auth_enabled(system_config, create_token_if_missing=False)
ray.exceptions.AuthenticationError: Token authentication is enabled but no authentication token was found.
2026-12-01 06:26:40,370\tINFO scripts.py:1200 -- see the log
"""


def test_error_line_is_the_exception_not_the_last_info_line() -> None:
    assert error_line(RAY_START_NO_TOKEN) == (
        "ray.exceptions.AuthenticationError: Token authentication is enabled but no "
        "authentication token was found.")


def test_error_line_falls_back_to_error_logs_then_the_last_line() -> None:
    logged = "x INFO a -- starting\nx ERROR b -- port 6379 is taken\nx INFO c -- bye\n"
    assert error_line(logged) == "x ERROR b -- port 6379 is taken"
    assert error_line("t\tERROR s.py:1 -- no room\nt\tINFO s.py:2 -- bye") == \
        "t\tERROR s.py:1 -- no room"
    assert error_line("one\ntwo\n\n") == "two"
    assert error_line("") == "no output"
