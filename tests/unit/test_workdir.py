"""The workdir that travels (launch/workdir.py): which files go, the cap, the digest, the tar and
the node side's refusal of archives that would write outside their folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.launch.workdir import (
    DEFAULT_MAX_UPLOAD,
    UnsafeArchive,
    UploadTooLarge,
    parse_size,
    select,
    unpack,
    write_tar,
)


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


def _paths(root: Path, **kw: int) -> list[str]:
    return [e.path for e in select(root, **kw).entries]


def test_gitignore_rules_nested_negation_and_dir_patterns(tmp_path: Path) -> None:
    _tree(tmp_path, {
        ".gitignore": "*.log\n!keep.log\nbuild/\n/top_only.txt\n",
        "train.py": "print(1)\n",
        "a.log": "x", "keep.log": "k",
        "build/out.bin": "b",
        "top_only.txt": "t", "sub/top_only.txt": "deeper, not anchored",
        "sub/.gitignore": "*.ckpt\n!keep.log\nlocal/\n",
        "sub/model.ckpt": "c", "sub/x.log": "l", "sub/keep.log": "k2",
        "sub/local/a.txt": "a",
        "notbuild/build": "a file named build, not the folder",
    })
    assert _paths(tmp_path) == [
        ".gitignore", "keep.log", "notbuild/build", "sub/.gitignore", "sub/keep.log",
        "sub/top_only.txt", "train.py"]


def test_gpufleetignore_has_the_last_word_and_always_skipped_folders(tmp_path: Path) -> None:
    _tree(tmp_path, {
        ".gitignore": "!data/\n",
        ".gpufleetignore": "data/\n*.npy\n!small.npy\n",
        "data/shard0": "s", "x.npy": "n", "small.npy": "n", "run.py": "r",
        ".git/HEAD": "ref", "pkg/__pycache__/m.pyc": "c", ".venv/bin/python": "p",
        "pkg/m.py": "m",
    })
    assert _paths(tmp_path) == [".gitignore", ".gpufleetignore", "pkg/m.py", "run.py", "small.npy"]


def test_links_inside_kept_as_links_outside_left_out(tmp_path: Path) -> None:
    outside = _tree(tmp_path / "outside", {"secret.txt": "s"})
    root = _tree(tmp_path / "root", {"shards/v2/a.bin": "a", "run.py": "r"})
    (root / "data").symlink_to("shards/v2")
    (root / "esc").symlink_to("../outside/secret.txt")
    (root / "abs").symlink_to(outside / "secret.txt")
    (root / "outdir").symlink_to(outside)
    sel = select(root)
    by_path = {e.path: e for e in sel.entries}
    assert sorted(by_path) == ["data", "run.py", "shards/v2/a.bin"]
    assert by_path["data"].is_link and by_path["data"].size == len("shards/v2")


def test_cap_names_total_cap_five_largest_and_the_fix(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {f"f{i}.bin": b"x" * (1000 * (i + 1)) for i in range(7)}
    _tree(tmp_path, files)
    with pytest.raises(UploadTooLarge) as err:
        select(tmp_path, max_bytes=10_000)
    msg = str(err.value)
    assert isinstance(err.value, GpufleetError) and isinstance(err.value, ValueError)
    assert "27.3 KiB" in msg and "9.8 KiB" in msg  # total 28000 B, cap 10000 B
    for name in ("f6.bin", "f5.bin", "f4.bin", "f3.bin", "f2.bin"):
        assert name in msg
    assert "f1.bin" not in msg and "f0.bin" not in msg
    assert ".gpufleetignore" in msg and "--max-upload" in msg
    assert "\n" not in msg
    assert select(tmp_path, max_bytes=28_000).total_bytes == 28_000


def test_digest_stable_and_content_sensitive(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a", {"run.py": "print(1)\n", "lib/u.py": "x = 1\n"})
    b = _tree(tmp_path / "b", {"lib/u.py": "x = 1\n", "run.py": "print(1)\n"})
    os.utime(b / "run.py", (1, 1))  # mtimes do not count
    da = select(a).digest
    assert da == select(b).digest == select(a).digest
    (b / "run.py").write_text("print(2)\n")
    assert select(b).digest != da
    (b / "run.py").write_text("print(1)\n")
    (b / "run.py").chmod(0o755)  # the executable bit counts
    assert select(b).digest != da
    (b / "run.py").chmod(0o644)
    (b / "lib/u.py").rename(b / "lib/v.py")  # so do names
    assert select(b).digest != da


def test_tar_round_trip_is_deterministic_and_exact(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", {"run.py": "print(1)\n", "lib/u.py": "x" * 5000,
                                   "ignored.log": "no", ".gitignore": "*.log\n"})
    (src / "run.py").chmod(0o755)
    (src / "lnk").symlink_to("lib/u.py")
    sel = select(src)
    one, two = io.BytesIO(), io.BytesIO()
    n = write_tar(sel, one)
    write_tar(select(src), two)
    assert n == len(one.getvalue()) and one.getvalue() == two.getvalue()
    dest = tmp_path / "node" / sel.digest
    unpack(io.BytesIO(one.getvalue()), dest)
    assert select(dest).digest == sel.digest
    assert os.access(dest / "run.py", os.X_OK) and not (dest / "ignored.log").exists()
    assert os.readlink(dest / "lnk") == "lib/u.py"
    assert [p.name for p in dest.parent.iterdir()] == [sel.digest]  # no temporary left


def test_unpack_keeps_an_existing_destination(tmp_path: Path) -> None:
    sel = select(_tree(tmp_path / "src", {"run.py": "new"}))
    buf = io.BytesIO()
    write_tar(sel, buf)
    dest = _tree(tmp_path / "dest", {"run.py": "already here"})
    unpack(io.BytesIO(buf.getvalue()), dest)
    assert (dest / "run.py").read_text() == "already here"


def _evil(members: list[tuple[str, str, str]]) -> io.BytesIO:
    """A tar.gz of (name, kind, data): kind 'file' (data = content), 'link' or 'hard' (data =
    the target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data.encode()))
            else:
                info.type = tarfile.SYMTYPE if kind == "link" else tarfile.LNKTYPE
                info.linkname = data
                tar.addfile(info)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("members", [
    [("../escape.txt", "file", "x")],
    [("/tmp/abs.txt", "file", "x")],
    [("ok/../../escape.txt", "file", "x")],
    [("out", "link", "/etc/passwd")],
    [("out", "link", "../../etc")],
    [("hard", "hard", "/etc/passwd")],
    # a lexically clean name written through a link made by an earlier member
    [("d", "link", "."), ("d/e", "link", ".."), ("d/e/escape.txt", "file", "x")],
], ids=["dotdot", "absolute", "nested-dotdot", "abs-link", "rel-link-out", "hardlink", "via-link"])
def test_unpack_refuses_archives_that_write_outside(tmp_path: Path,
                                                    members: list[tuple[str, str, str]]) -> None:
    dest = tmp_path / "cache" / "digest"
    with pytest.raises(UnsafeArchive):
        unpack(_evil(members), dest)
    assert not dest.exists() and list((tmp_path / "cache").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


@pytest.mark.parametrize(("text", "n"), [("100MB", DEFAULT_MAX_UPLOAD), ("1GB", 2**30), ("1G", 2**30),
                                          ("512KiB", 512 * 2**10), ("2048", 2048), ("1.5M", 3 * 2**19)])
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "lots", "10 XB", "-5MB", "1e9", "MB"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)
