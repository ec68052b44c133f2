"""The run pages (`hpc report html`, toolkit.reports.page) opened in a real browser: Debian's headless Chromium
(`make chromium` installs it) reads each page from disk (file://), the test finds the ledger's numbers in the page
Chromium rendered, no console message (the pages have no script: any message is an error, such as a blocked
resource) and no image that is not inside the page; and saves a screenshot in the test's tmp dir. The run dirs are
written by the real writers (tests/test_goodput.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_hpc
from tests.test_goodput import write_run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without the background-networking flags Chromium calls Google's hosts at start (refused here, and nothing may
# leave the machine); the pages themselves need no network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-default-apps", "--enable-logging=stderr", "--v=0"]
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (.*)")  # Chromium's log line for a page's console message


def browse(page: Path, profile: Path, *extra: str) -> tuple[str, list[str]]:
    """The DOM Chromium rendered from the page on disk, and the page's console messages."""
    if not Path(CHROMIUM).exists():
        pytest.fail("no chromium: `make chromium` installs Debian's package (apt-get install -y chromium)")
    res = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, [m.group(1) for m in map(CONSOLE.search, res.stderr.splitlines()) if m]


def screenshot(page: Path, profile: Path, shot: Path) -> None:
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1280,2000",
                    page.as_uri()], capture_output=True, text=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000


def test_the_console_check_sees_a_pages_errors(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<html><body><p>x</p><script>console.error("broken page")</script></body></html>')
    _, console = browse(page, tmp_path / "profile")
    assert any("broken page" in line for line in console), console


def test_run_pages_show_the_ledger_in_a_browser_without_network_or_errors(tmp_path, monkeypatch):
    run = write_run(tmp_path, monkeypatch)
    old = write_run(tmp_path / "older", monkeypatch)  # an older hpc's run dir: no submission time, no pre-flights
    meta = json.loads((old.path / "metadata.json").read_text())
    del meta["submitted_at"]
    (old.path / "metadata.json").write_text(json.dumps(meta))
    (old.path / "preflight.jsonl").unlink()
    old.path.rename(tmp_path / "older-run")
    pages = tmp_path / "pages"
    res = run_hpc("report", "html", str(run.path), str(tmp_path / "older-run"), "-o", str(pages), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in pages.iterdir()) == ["index.html", "older-run.html", "run.html"]
    for page in pages.iterdir():
        html = page.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from elsewhere
        assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'<img [^>]*src="([^"]+)"', html))

    dom, console = browse(pages / "run.html", tmp_path / "profile")
    assert console == []
    assert re.search(r'id="goodput">14\.0%<', dom) and "of the wall time (57.0 s)" in dom
    for row in (r"queue</td><td>10\.0 s</td>\s*<td>17\.5%", r"requeue</td><td>18\.0 s", r"lost</td><td>2\.0 s",
                r"downtime</td><td>10\.5 s"):
        assert re.search(row, dom), row
    assert "restart on a spare: heartbeats silent: ranks 0-1 on c2" in dom and "requeued, excluding w2" in dom
    assert 'href="../run/logs/train_log.jsonl"' in dom  # relative: the pages travel with the run dirs

    dom, console = browse(pages / "older-run.html", tmp_path / "profile")
    assert console == [] and "Not in this run dir" in dom and "submitted_at" in dom and "preflight.jsonl" in dom
    assert "of the wall time (23.0 s)" in dom

    dom, console = browse(pages / "index.html", tmp_path / "profile")
    assert console == [] and 'href="run.html"' in dom and 'href="older-run.html"' in dom
    assert re.search(r'id="goodput">20\.0%<', dom)  # 16 s productive of 57 + 23 s
    screenshot(pages / "run.html", tmp_path / "profile", tmp_path / "run.png")
    screenshot(pages / "index.html", tmp_path / "profile", tmp_path / "index.png")


def test_a_value_from_a_run_dir_reaches_the_page_escaped(tmp_path, monkeypatch):
    run = write_run(tmp_path, monkeypatch)
    run.add_restart({"time": 1.0, "job_id": "9", "kind": "probe", "nodes": ["<script>alert(1)</script>"],
                     "why": "a & b"})
    out = tmp_path / "pages"
    assert run_hpc("report", "html", str(run.path), "-o", str(out)).returncode == 0
    html = (out / "run.html").read_text()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a &amp; b" in html
