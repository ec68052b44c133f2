"""Which network NCCL selected, from its INFO lines. Every line below is verbatim from a published log (the
source is named); only the tests' own multi-host logs are assembled from such lines."""

import pytest

from toolkit.reports.transport import EFA, IB, TCP, PLUGIN_FIX, PROVIDER_FIX, Transport, efa_expected, efa_problem, \
    logs_transport, nccl_transport

# (line, transport it shows, source)
LINES = [
    ("ip-10-216-179-87:417138:417176 [7] NCCL INFO NET/OFI Selected Provider is efa", EFA, "NVIDIA/nccl#527"),
    ("ip-10-216-179-87:417138:417176 [7] NCCL INFO Using network AWS Libfabric", EFA, "NVIDIA/nccl#527"),
    ("8h200-3:6310:6318 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)", EFA, "NVIDIA/nccl#1597"),
    ("8h200-2:6831:6840 [0] NCCL INFO Using network Libfabric", EFA, "NVIDIA/nccl#1597"),
    ("[1,7]<stdout>:ip-172-32-38-1:21471:22316 [7] NCCL INFO Ring 00 : 7 -> 8 [send] via NET/AWS Libfabric/0", EFA,
     "aws/aws-ofi-nccl#24"),
    ("ds-ml-01-0:17754:17754 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>", TCP, "NVIDIA/nccl#352"),
    ("ip-172-31-12-210:45305:45305 [0] NCCL INFO NET/Socket : Using [0]ens3:172.31.12.210<0>", TCP, "NVIDIA/nccl#226"),
    ("NCCL INFO Using network Socket", TCP, "a published DeepSpeed profile note"),
    ("lsp-ws1:7650:7708 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/Socket/0", TCP, "a published log"),
    ("gpu0301:842624:842643 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB int0:10.0.5.121<0>", IB,
     "a published RoCE log"),
    # says nothing about the data transport: NCCL's out-of-band bootstrap socket, and a CollNet symbol probe
    ("ip-10-3-35-83:362:362 [0] NCCL INFO Bootstrap : Using eth0:10.3.35.83<0>", None, "aws/aws-ofi-nccl#67"),
    ("ip-10-3-35-83:362:362 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.", None,
     "aws/aws-ofi-nccl#67"),
]


@pytest.mark.parametrize("line,expected,source", LINES)
def test_each_published_line(line, expected, source):
    found = nccl_transport(line)
    assert found.name == expected, source
    assert found.evidence == (line[line.index("<stdout>:") + 9:] if "<stdout>" in line else line if expected else None)
    assert not found.plugin_missing


@pytest.mark.parametrize("line", [
    "ds-ml-01-0:17754:17754 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).",  # NVIDIA/nccl#352
    "vae-bc5a469e-2296-0:10208:10226 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. "
    "Using internal net plugin.",
    "user:695833:695833 [2] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot "
    "open shared object file: No such file or directory",  # NVIDIA/nccl-tests#188
])
def test_plugin_not_found_lines(line):
    assert nccl_transport(line).plugin_missing


# NVIDIA/nccl#352: no plugin, no IB, so sockets (the order NCCL prints them in)
SOCKET_FALLBACK = """\
ds-ml-01-0:17754:17754 [0] NCCL INFO Bootstrap : Using [0]lo:127.0.0.1<0>
ds-ml-01-0:17754:17754 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
ds-ml-01-0:17754:17754 [0] NCCL INFO NET/IB : No device found.
ds-ml-01-0:17754:17754 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
NCCL version 2.4.8+cuda10.1
"""
# the EKS EFA post's launcher log (aws-samples, nccl-tests-efa on 2x p4d)
EFA_LOG = """\
[1,0]<stdout>:nccl-tests-efa-worker-0:26:26 [0] NCCL INFO Bootstrap : Using eth0:172.31.94.17<0>
[1,0]<stdout>:nccl-tests-efa-worker-0:26:26 [0] NCCL INFO NET/OFI Selected Provider is efa
[1,0]<stdout>:nccl-tests-efa-worker-0:26:26 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.
[1,0]<stdout>:nccl-tests-efa-worker-0:26:26 [0] NCCL INFO Using network AWS Libfabric
[1,10]<stdout>:nccl-tests-efa-worker-1:27:27 [2] NCCL INFO NET/OFI Selected Provider is efa
[1,10]<stdout>:nccl-tests-efa-worker-1:27:27 [2] NCCL INFO Using network AWS Libfabric
"""


def test_a_socket_fallback_log_and_an_efa_log():
    fallback = nccl_transport(SOCKET_FALLBACK, "fallback.log")
    assert (fallback.name, fallback.plugin_missing, fallback.hosts) == (TCP, True, {"ds-ml-01-0": TCP})
    assert fallback.evidence == "ds-ml-01-0:17754:17754 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>"
    assert fallback.label == "TCP sockets" and fallback.source == "fallback.log"
    efa = nccl_transport(EFA_LOG)
    assert efa.name == EFA and not efa.plugin_missing
    assert efa.hosts == {"nccl-tests-efa-worker-0": EFA, "nccl-tests-efa-worker-1": EFA}


def test_one_host_without_the_plugin_makes_the_job_a_socket_job():
    worker1 = "[1,10]<stdout>:nccl-tests-efa-worker-1:27:27 [2] NCCL INFO "
    worker1_fell_back = EFA_LOG.replace(f"{worker1}Using network AWS Libfabric", f"{worker1}Using network Socket")
    worker1_fell_back = worker1_fell_back.replace(f"{worker1}NET/OFI Selected Provider is efa",
                                                  f"{worker1}NET/Plugin : No plugin found (libnccl-net.so).")
    found = nccl_transport(worker1_fell_back)
    assert found.name == TCP and found.hosts == {"nccl-tests-efa-worker-0": EFA, "nccl-tests-efa-worker-1": TCP}
    assert found.evidence.endswith("NCCL INFO Using network Socket")
    message = efa_problem(found, efa_expected=True)
    assert "NCCL used TCP sockets on nccl-tests-efa-worker-1 " in message and PLUGIN_FIX in message
    # per-rank logs of one job: the same answer; silent ones say nothing
    merged = logs_transport({"0.out": EFA_LOG, "1.out": SOCKET_FALLBACK, "2.out": "no NCCL here\n"})
    assert merged.name == TCP and merged.source == "1.out" and merged.plugin_missing
    assert merged.hosts == {"nccl-tests-efa-worker-0": EFA, "nccl-tests-efa-worker-1": EFA, "ds-ml-01-0": TCP}
    assert logs_transport({"a": "nothing", "b": ""}) == Transport(None)


def test_plugin_loaded_but_no_efa_provider():
    # first line verbatim from aws/aws-ofi-nccl#1020 (the container did not see /dev/infiniband); the second is
    # assembled: the plugin then picking libfabric's TCP provider, which is sockets too
    text = ("[2025-10-16 22:16:08] ip-172-31-3-90:1929:1937 [0] nccl_net_ofi_rdma_init:7978 NCCL WARN NET/OFI OFI "
            "fi_getinfo() call failed: No data available\n"
            "ip-172-31-3-90:1929:1937 [0] NCCL INFO NET/OFI Selected Provider is tcp\n")
    found = nccl_transport(text)
    assert found.name == TCP and found.no_efa_provider and not found.plugin_missing
    assert PROVIDER_FIX in efa_problem(found, True)


def test_what_is_flagged():
    socket = nccl_transport(SOCKET_FALLBACK)
    assert efa_problem(socket, efa_expected=False) is None  # a TCP queue: sockets are what it has
    assert efa_problem(socket, efa_expected=None) is None  # the run does not say: nothing to hold it to
    assert efa_problem(nccl_transport(EFA_LOG), True) is None
    assert efa_problem(Transport(None), True) is None  # NCCL_DEBUG=INFO was off: nothing to judge
    assert Transport(None).label.startswith("not in the logs")
    message = efa_problem(socket, True)
    assert message.startswith("the queue has EFA but NCCL used TCP sockets (log: ds-ml-01-0:17754:17754")
    assert "LD_LIBRARY_PATH" in message and "NCCL_NET" in message


@pytest.mark.parametrize("fabric,expected", [("modern", True), ("legacy", True), ("none", False), (None, None)])
def test_efa_expected_from_the_queues_fabric(fabric, expected):
    assert efa_expected(fabric) is expected
