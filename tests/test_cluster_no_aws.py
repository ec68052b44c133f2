"""Nothing reaches AWS: every way out (endpoint, proxies, instance metadata, container credentials) points at
a local listener, and validating valid and invalid configs must not connect to it even once; and nothing else
leaves the machine either (no name look-up, no connection to any address, e.g. a custom action's script URL)."""

import os
import socket
import threading
import time

import pytest

from tests.conftest import cli_json, REPO, run_hpc, run_hpc_process


@pytest.fixture
def listener():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    connections = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            connections.append(conn.recv(200))
            conn.close()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    yield url, connections
    stop.set()
    thread.join()
    server.close()


def _trap_env(url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k.lower() != "no_proxy"}
    env.update({
        "AWS_ENDPOINT_URL": url, "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": url, "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"{url}/credentials",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00", "AWS_SECRET_ACCESS_KEY": "not-a-real-secret",
    })
    return env


def test_validating_valid_and_invalid_configs_never_connects(listener, tmp_path):
    url, connections = listener
    broken = tmp_path / "broken.yaml"
    broken.write_text((REPO / "cluster-configs" / "p3dn-efa-fsx.yaml").read_text()
                      .replace("MaxCount: 8", "MaxCount: 0").replace("  CustomAmi:", "  # CustomAmi:"))
    env = _trap_env(url)
    started = time.time()
    results = [run_hpc("cluster", "validate", str(path), "--json", env=env, timeout=60) for path in (
        REPO / "cluster-configs" / "p3dn-efa-fsx.yaml", REPO / "cluster-configs" / "p5-reservation.yaml", broken)]
    assert [r.returncode for r in results] == [0, 0, 1], [r.stderr for r in results]
    assert time.time() - started < 30  # nothing waited on a network timeout
    time.sleep(0.3)
    assert connections == []


def test_a_call_to_aws_fails_fast_with_a_clear_message(listener, monkeypatch):
    url, connections = listener
    for key, value in _trap_env(url).items():
        monkeypatch.setenv(key, value)
    from pcluster.aws.aws_api import AWSApi

    from toolkit.cluster import pcluster_offline

    started = time.time()
    with pcluster_offline._offline("us-east-1", set(), {}):
        with pytest.raises(pcluster_offline.OfflineAccessError, match=r"needs AWS \(s3\.head_bucket\)"):
            AWSApi.instance().s3.head_bucket("my-bucket")
        with pytest.raises(pcluster_offline.OfflineAccessError, match="not checked offline"):
            AWSApi.instance().ec2.get_official_image_id("ubuntu2204", "x86_64")
    assert time.time() - started < 2 and connections == []


# A process-wide trap for everything else that leaves the machine: name look-ups (DNS) and connections to any
# address. It records each attempt in $NET_LOG and refuses it.
NET_TRAP = '''
import os, socket
_log = os.environ["NET_LOG"]
def _record(what):
    with open(_log, "a") as f:
        f.write(what + "\\n")
def _refuse(name):
    def refuse(*args, **kwargs):
        _record(f"{name} {args[:2]!r}")
        raise OSError(f"network refused by the test: {name}")
    return refuse
socket.getaddrinfo = _refuse("getaddrinfo")
socket.gethostbyname = _refuse("gethostbyname")
socket.create_connection = _refuse("create_connection")
socket.socket.connect = _refuse("connect")
socket.socket.connect_ex = _refuse("connect_ex")
'''


@pytest.fixture
def net_trap(tmp_path):
    (tmp_path / "trap").mkdir()
    (tmp_path / "trap" / "sitecustomize.py").write_text(NET_TRAP)
    log = tmp_path / "net.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and "proxy" not in k.lower()}
    env.update(PYTHONPATH=str(tmp_path / "trap"), NET_LOG=str(log))
    return env, log


def test_validating_urls_storage_and_unknown_types_touches_no_network(net_trap, tmp_path):
    env, log = net_trap
    config = (REPO / "tests" / "data" / "cluster" / "existing-fsx.yaml").read_text().replace(
        "      Networking:\n        SubnetIds:",
        "      CustomActions:\n        OnNodeConfigured:\n          Script: https://scripts.example.com/setup.sh\n"
        "        OnNodeStart:\n          Script: s3://my-bucket/start.sh\n"
        "      Networking:\n        SubnetIds:").replace("c5.4xlarge", "x9.mega")
    path = tmp_path / "c.yaml"
    path.write_text(config)
    started = time.time()
    res = run_hpc_process("cluster", "validate", str(path), "--json", env=env, timeout=60)
    assert not log.exists(), log.read_text()
    assert res.returncode == 0, res.stdout + res.stderr
    report = cli_json(res)
    assert {"AsyncTimedUrlValidator", "existing FSx"} <= set(report["not_checked_offline"])
    assert any("x9.mega" in f["message"] and f["level"] == "warning" for f in report["findings"])
    assert time.time() - started < 30
