"""Which network transport NCCL selected, read from its `NCCL_DEBUG=INFO` lines in a job's logs.

The commonest silent failure on AWS GPU clusters is NCCL falling back to TCP sockets (aws-ofi-nccl not found,
or found but without an EFA device): training runs at a fraction of the speed and nothing errors. NCCL says
what it chose, per process, in lines such as (all seen in published logs):

    host:pid:tid [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)    aws-ofi-nccl over EFA
    host:pid:tid [0] NCCL INFO Using network AWS Libfabric                         the plugin (<= 1.9 name)
    host:pid:tid [0] NCCL INFO Using network Libfabric                             the plugin (newer name)
    host:pid:tid [0] NCCL INFO Channel 00 : 15[1c0] -> 0[1c0] [receive] via NET/AWS Libfabric/0
    host:pid:tid [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).      plugin missing ...
    host:pid:tid [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.
    host:pid:tid [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>             ... so sockets
    host:pid:tid [0] NCCL INFO Using network Socket
    host:pid:tid [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB ...       InfiniBand / RoCE verbs

`Bootstrap : Using ...` is NCCL's out-of-band socket, used by every transport: it says nothing here. The
plugin can also load and pick libfabric's TCP provider (`Selected Provider is tcp`): that is sockets too.
One host without the plugin drags the whole job to socket speed, so the verdict is per host and the worst wins.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from toolkit.rundir import RunDir

EFA, TCP, IB = "efa", "tcp", "ib"
_LABELS = {EFA: "EFA (aws-ofi-nccl)", TCP: "TCP sockets", IB: "InfiniBand verbs"}

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours (Ray, SkyPilot) in saved logs
# The host of an NCCL log line: `host:pid:tid [dev] NCCL INFO ...`, after any launcher prefix.
_HOST = re.compile(r"(\w[\w.-]*):\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)")  # host names may start with a digit
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\S+)")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_CHANNEL = re.compile(r"via NET/(AWS Libfabric|Libfabric|Socket|IBext\w*|IB\w*)")
_SOCKET_INIT = re.compile(r"NET/Socket ?: Using \[")
_IB_INIT = re.compile(r"NET/IB ?: Using \[")
_PLUGIN_MISSING = re.compile(r"NET/Plugin ?: ?(?:No plugin found|Could not find: libnccl-net|"
                             r"Plugin load \(libnccl-net[^)]*\) returned)")
_NO_EFA_PROVIDER = re.compile(r"NET/OFI (?:Could not find any optimal provider|OFI fi_getinfo\(\) call failed)")


@dataclasses.dataclass(frozen=True)
class Transport:
    """NCCL's network transport in a job's logs (see the module docstring)."""

    name: str | None  # efa / tcp / ib; the worst over hosts (tcp beats ib beats efa); None when NCCL did not say
    evidence: str | None = None  # the log line that decided it (for tcp: a socket line, not an EFA one)
    hosts: dict[str, str] = dataclasses.field(default_factory=dict)  # host -> its transport, where lines name hosts
    plugin_missing: bool = False  # NCCL said it found no network plugin (aws-ofi-nccl) to load
    no_efa_provider: bool = False  # the plugin loaded but libfabric offered it no EFA provider
    source: str | None = None  # the log file it came from

    @property
    def label(self) -> str:
        return _LABELS.get(self.name or "", "not in the logs (run with NCCL_DEBUG=INFO)")


def _classify(line: str) -> str | None:
    """The transport one NCCL line shows, or None if it shows none."""
    if m := _PROVIDER.search(line):
        return EFA if m.group(1).lower().startswith("efa") else TCP
    if m := _NETWORK.search(line):
        network = m.group(1).lower()
        if network.startswith("ib"):
            return IB
        return EFA if "libfabric" in network else TCP if network == "socket" else None
    if m := _CHANNEL.search(line):
        network = m.group(1).lower()
        return EFA if "libfabric" in network else TCP if network == "socket" else IB
    if _SOCKET_INIT.search(line):
        return TCP
    if _IB_INIT.search(line):
        return IB
    return None


_RANK = {EFA: 0, IB: 1, TCP: 2}  # worse transports win: one socket host slows every collective


def _keep_worst(hosts: dict[str, str], host: str, name: str) -> None:
    if host not in hosts or _RANK[name] > _RANK[hosts[host]]:
        hosts[host] = name


def nccl_transport(text: str, source: str | None = None) -> Transport:
    """The transport NCCL selected in one log's text (see the module docstring)."""
    hosts: dict[str, str] = {}
    evidence: dict[str, str] = {}  # transport -> first line showing it
    plugin_missing = no_efa = False
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        plugin_missing = plugin_missing or bool(_PLUGIN_MISSING.search(line))
        no_efa = no_efa or bool(_NO_EFA_PROVIDER.search(line))
        found = _classify(line)
        if found is None:
            continue
        line = ANSI.sub("", line)
        host = _HOST.search(line)
        # the evidence is NCCL's own line, without launcher prefixes
        evidence.setdefault(found, line[host.start():] if host else line[line.find("NCCL"):].strip())
        if host:
            _keep_worst(hosts, host.group(1), found)
    name = max(evidence, key=_RANK.__getitem__, default=None)
    return Transport(name, evidence.get(name) if name else None, hosts, plugin_missing, no_efa, source)


def logs_transport(logs: dict[str, str]) -> Transport:
    """The transport over several logs of one job (source -> text; one per rank or node): the worst any shows."""
    found = [t for t in (nccl_transport(text, source) for source, text in logs.items()) if t.name or t.plugin_missing]
    if not found:
        return Transport(None)
    worst = max(found, key=lambda t: _RANK.get(t.name or "", -1))
    hosts: dict[str, str] = {}
    for t in found:
        for host, name in t.hosts.items():
            _keep_worst(hosts, host, name)
    return dataclasses.replace(worst, hosts=hosts, plugin_missing=any(t.plugin_missing for t in found),
                               no_efa_provider=any(t.no_efa_provider for t in found))


PLUGIN_FIX = ("NCCL did not load aws-ofi-nccl: put the plugin's lib dir (/opt/amazon/ofi-nccl/lib from current EFA "
              "installers, /opt/aws-ofi-nccl/lib on older AMIs and containers) on the ranks' LD_LIBRARY_PATH, or set "
              "NCCL_NET_PLUGIN=ofi where it ships only libnccl-net-ofi.so; set NCCL_NET to the plugin's network name "
              "('AWS Libfabric' up to aws-ofi-nccl 1.9, 'Libfabric' after) so a missing plugin fails instead of "
              "falling back to sockets")
PROVIDER_FIX = ("aws-ofi-nccl loaded but libfabric offered no EFA provider: check that the nodes have EFA devices "
                "(`fi_info -p efa`), that containers see /dev/infiniband, and that the queue has Efa: Enabled: true")


def efa_expected(fabric: str | None) -> bool | None:
    """Whether a queue runs NCCL over EFA by its `fabric` (Queue.fabric, the EFA stack jobs on the queue set up:
    modern | legacy, or none for TCP); None when a run dir predates it."""
    return None if fabric is None else fabric != "none"


def efa_problem(transport: Transport, efa_expected: bool | None) -> str | None:
    """Why a run that should use EFA did not, with the fix; None when there is nothing to flag.

    efa_expected: the queue declares EFA (True), does not (False), or the run does not say (None: nothing flagged).
    """
    if not efa_expected or transport.name in (None, EFA):
        return None
    slow = sorted(h for h, name in transport.hosts.items() if name != EFA)
    where = f" on {', '.join(slow)}" if slow and len(slow) < len(transport.hosts) else ""
    fix = PROVIDER_FIX if transport.no_efa_provider and not transport.plugin_missing else PLUGIN_FIX
    return (f"the queue has EFA but NCCL used {transport.label}{where} (log: {transport.evidence}); "
            f"expect a fraction of EFA bandwidth. fix: {fix}")


@dataclasses.dataclass(frozen=True)
class Network:
    """Which network NCCL used in a run (over the run's logs), and the problem when the run's queue has EFA but
    NCCL used something else."""

    transport: Transport
    problem: str | None

    def to_json(self) -> dict[str, Any]:
        t = self.transport
        return {"transport": t.name, "label": t.label, "evidence": t.evidence, "hosts": t.hosts, "source": t.source,
                "problem": self.problem}


def run_network(run: RunDir, texts: Mapping[Path, str] | None = None) -> Network:
    """NCCL's network over a run dir's logs (`texts`: run.log_texts(), when the caller has read them already),
    flagged against the EFA its queue has (Metadata.fabric; an older run dir's says nothing: not flagged)."""
    found = logs_transport({str(p): t for p, t in (texts or run.log_texts()).items()})
    meta = run.metadata()
    return Network(found, efa_problem(found, efa_expected(meta.fabric if meta else None)))
