"""The folder of compiled eBPF objects: root loads what is in it, so the lab refuses a folder or
object another user could have planted, a symlink, or anything others can write."""

import os

import pytest

from fabriclab.errors import LabError
from fabriclab.queues import datapath


@pytest.fixture
def cache(tmp_path, monkeypatch):
    tmp_path.chmod(0o700)
    monkeypatch.setattr(datapath, "CACHE_DIR", tmp_path / "fabriclab" / "bpf")
    return tmp_path


def test_the_folder_is_made_private(cache):
    made = datapath.cache_dir()
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    assert datapath.cache_dir() == made                      # checked again, still fine


def test_a_folder_others_can_write_is_refused(cache):
    (cache / "fabriclab").mkdir(mode=0o700)
    (cache / "fabriclab").chmod(0o777)
    with pytest.raises(LabError, match=r"refusing .*/fabriclab: others can write it \(mode 777\)") as err:
        datapath.cache_dir()
    assert "\n" not in str(err.value)


def test_a_symlink_planted_in_its_place_is_refused(cache):
    elsewhere = cache / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cache / "fabriclab").mkdir(mode=0o700)
    os.symlink(elsewhere, cache / "fabriclab" / "bpf")
    with pytest.raises(LabError, match="bpf: it is a symlink"):
        datapath.cache_dir()


def test_a_folder_or_object_of_another_user_is_refused(cache, monkeypatch):
    obj = datapath.cache_dir() / "fabricq-0123.o"
    obj.write_bytes(b"\x7fELF")
    datapath.check_private(obj)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(LabError, match=r"fabricq-0123.o: it belongs to uid \d+, not \d+"):
        datapath.check_private(obj)


def test_a_planted_object_is_not_loaded(cache, monkeypatch):
    """An object already in the folder is only reused if it is the lab's own."""
    source = cache / "prog.bpf.c"
    source.write_text("int x;\n")
    digest = __import__("hashlib").sha256(source.read_bytes()).hexdigest()[:16]
    planted = datapath.cache_dir() / f"prog-{digest}.o"
    planted.write_bytes(b"planted")
    planted.chmod(0o666)
    with pytest.raises(LabError, match="others can write it"):
        datapath.compile_object(source, "a test")
