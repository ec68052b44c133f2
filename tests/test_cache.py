"""The user's cache of what hpc derives from its packaged files (toolkit.cache): the parsed catalog and the compiled
job templates. It must give what deriving gives, notice a changed source, and never be needed."""

from __future__ import annotations

import datetime
import json
import os
import re

import pytest

from tests.conftest import REPO, run_hpc_process
from toolkit import cache

P5 = REPO / "cluster-configs" / "p5-reservation.yaml"


class Counted:
    def __init__(self, value=None):
        self.calls, self.value = 0, value

    def __call__(self, text: str):
        self.calls += 1
        return self.value if self.value is not None else {"text": text, "n": [1, 2.5, None, True]}


def test_a_value_is_derived_once_per_source_and_then_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "c"))
    derive = Counted()
    first = cache.cached_json("thing", "source one", derive)
    assert cache.cached_json("thing", "source one", derive) == first == {"text": "source one",
                                                                          "n": [1, 2.5, None, True]}
    assert derive.calls == 1
    assert cache.cached_json("thing", "source two", derive)["text"] == "source two"  # an edited source: afresh
    assert derive.calls == 2
    assert len(list((tmp_path / "c").glob("thing-*.json"))) == 2
    assert oct((tmp_path / "c").stat().st_mode & 0o777) == "0o700"


def test_an_edited_derive_derives_afresh(tmp_path, monkeypatch):
    """A new hpc (or a checkout) that parses the same source differently must not get the old parse back."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    assert cache.cached_json("thing", "src", lambda text: {"v": 1}) == {"v": 1}
    assert cache.cached_json("thing", "src", lambda text: {"v": 2, "text": text}) == {"v": 2, "text": "src"}


def test_old_entries_are_pruned_to_the_newest_few(tmp_path, monkeypatch):
    """Each upgrade (or edit) of a source leaves an entry behind: a name keeps its newest KEEP."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    for n in range(cache.KEEP + 3):
        cache.cached_json("thing", f"version {n}", Counted())
        [newest] = [p for p in tmp_path.glob("thing-*.json") if json.loads(p.read_text())["text"] == f"version {n}"]
        os.utime(newest, (1_000_000 + n, 1_000_000 + n))
    cache.cached_json("other", "src", Counted())
    kept = sorted(json.loads(p.read_text())["text"] for p in tmp_path.glob("thing-*.json"))
    assert kept == [f"version {n}" for n in range(3, cache.KEEP + 3)]
    assert len(list(tmp_path.glob("other-*.json"))) == 1


def test_a_garbled_entry_is_derived_again_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    derive = Counted()
    cache.cached_json("thing", "src", derive)
    [entry] = tmp_path.glob("thing-*.json")
    entry.write_text('{"text": "cut sho')
    assert cache.cached_json("thing", "src", derive)["text"] == "src"
    assert derive.calls == 2 and json.loads(entry.read_text())["text"] == "src"


def test_a_value_json_would_change_is_returned_and_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    dated = {"since": datetime.date(2026, 11, 30)}
    assert cache.cached_json("dated", "src", Counted(dated)) == dated
    tupled = {"pair": (1, 2)}
    assert cache.cached_json("tupled", "src", Counted(tupled)) == tupled
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["off", "not a directory"])
def test_without_a_usable_cache_every_call_derives_and_nothing_is_written(tmp_path, monkeypatch, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, "" if where == "off" else str(blocker / "hpc"))
    derive = Counted()
    for _ in range(2):
        assert cache.cached_json("thing", "src", derive)["text"] == "src"
    assert derive.calls == 2
    assert cache.template_cache() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_directory_others_may_write_to_is_not_used(tmp_path, monkeypatch):
    """Its entries are run (jinja's compiled templates) or believed (the catalog): a shared /tmp path is no cache."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    derive = Counted()
    for _ in range(2):
        cache.cached_json("thing", "src", derive)
    assert derive.calls == 2 and list(shared.iterdir()) == [] and cache.template_cache() is None
    shared.chmod(0o700)
    assert cache.cache_dir() == shared


def test_an_entry_that_cannot_be_written_is_derived_next_time_without_a_word(tmp_path, monkeypatch):
    """A full disk or a quota: mkstemp or the write fails (a stand-in raises ENOSPC from mkstemp)."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("tempfile.mkstemp", full)
    derive = Counted()
    for _ in range(2):
        assert cache.cached_json("thing", "src", derive)["text"] == "src"
    assert derive.calls == 2 and list(tmp_path.iterdir()) == []


def test_the_default_place_is_the_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "hpc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "hpc"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid by the XDG spec: ignored
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "hpc"
    monkeypatch.setenv(cache.CACHE_ENV, "~/hpc-cache")
    assert cache.cache_dir() == tmp_path / "home" / "hpc-cache"
    # no home at all (no $HOME and a uid without a passwd entry, as in a container): no cache, no error
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME")
    monkeypatch.setattr("pwd.getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    assert cache.cache_dir() is None


def test_a_render_from_the_cache_is_the_render_without_it(tmp_path):
    """Two processes with a cache (the first fills it: the catalog's JSON and jinja's compiled templates, the
    second reads them) render byte for byte what a process without one renders."""
    env = dict(os.environ, HPC_RUNS_DIR=str(tmp_path / "runs"))
    args = ("recipes", "render", "resnet50", "--cluster", str(P5), "--nodes", "2")
    renders = []
    for cache_dir in ("", str(tmp_path / "cache"), str(tmp_path / "cache")):
        res = run_hpc_process(*args, env=dict(env, HPC_CACHE_DIR=cache_dir))
        assert res.returncode == 0, res.stderr
        renders.append(re.sub(r"resnet50-\d{8}-\d{6}-[0-9a-f]+", "RUN", res.stdout))  # each plan's own run dir
        if cache_dir:
            [catalog] = (tmp_path / "cache").glob("catalog-*.json")
            compiled = sorted(p.name for p in (tmp_path / "cache" / "templates").iterdir())
            assert len(compiled) == 2, compiled  # job.sbatch.j2 and the setup.sh.j2 it includes
    assert "#SBATCH --nodes=2" in renders[0]
    assert renders[1] == renders[0] and renders[2] == renders[0]
    assert json.loads(catalog.read_text())["instances"]["p5.48xlarge"]["gpus"] == 8
    # Garbled entries (jinja's header kept, the rest not: pickle's error, which jinja does not catch): rendered
    # afresh, the same, and the entries rewritten whole.
    from jinja2.bccache import bc_magic

    for entry in (tmp_path / "cache" / "templates").iterdir():
        entry.write_bytes(bc_magic + b"garbled")
    catalog.write_text('{"instances": {"p5.48xl')
    res = run_hpc_process(*args, env=dict(env, HPC_CACHE_DIR=str(tmp_path / "cache")))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert re.sub(r"resnet50-\d{8}-\d{6}-[0-9a-f]+", "RUN", res.stdout) == renders[0]
    assert all(len(e.read_bytes()) > 1000 for e in (tmp_path / "cache" / "templates").iterdir())
    assert json.loads(catalog.read_text())["instances"]["p5.48xlarge"]["gpus"] == 8
