"""Read nccl-tests results (text logs of every published format, and `-J` JSON), summarise them, judge them.

Text parsing keys on the column header line, never on field counts alone: the header says which columns a row
has (with or without `redop`/`root`, `#wrong` or the pre-2022 float `error`, `-I 1` per-iteration columns,
`#bitdiff`, a `-S` timestamp) and how they split into the out-of-place and in-place groups. Lines may carry
launcher prefixes (`(head, rank=0, pid=N) ` from Ray/SkyPilot, then `[1,0]<stdout>:` from mpirun --tag-output
or `0: ` from srun --label) and NCCL's own `host:pid:tid [dev] NCCL INFO ...` lines, even in the middle of a row
(both write to the same stdout); such a row is stitched back together. One file may hold several tests (one per
header). A text log may start with `{` (a pasted `{ mpirun ...; } | tee` command): only a file that parses as
JSON is read as `-J` output.

Ranks and nodes: nccl-tests prints one `#  Rank  N Group G Pid P on HOST device D [bus] NAME` line per rank
(rank 0 gathers them over MPI), but pasted logs often keep only some. NCCL's own `comm 0x.. rank 0 nranks 16 ..`
(`nRanks 16 nNodes 2 ..` since 2.19) lines are the authority when present; the device lines count only when
they list ranks 0..N-1 in full. Otherwise the count is unknown, and said so, never guessed from a partial list.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Callable, Literal

from toolkit.accelerators import family_or_none
from toolkit.accelerators.base import CollectiveReference
from toolkit.errors import HpcError, UsageError
from toolkit.reports.transport import ANSI, nccl_transport

Status = Literal["PASS", "WARN", "FAIL", "NO-VERDICT"]

# Launcher prefixes, outermost first: Ray's `(head, rank=0, pid=N) `, `(worker1, rank=1, pid=N, ip=A) `,
# `(RayTrainWorker pid=N, ip=A) `; then mpirun --tag-output's `[1,0]<stdout>:` or srun --label's `0: `.
_PREFIX_RE = (r"(?:\((?:[\w-]+,? )?(?:rank=\d+, )?pid=\d+(?:, ip=[\d.]+)?\)\s)?"
              r"(?:\[\d+,\d+\]<std(?:out|err)>:\s?|\s*\d+:\s)?")
_PREFIX = re.compile("^" + _PREFIX_RE)
# NCCL's debug prefix `host:pid:tid [dev] `: where it starts, the rest of the line is NCCL's, not the table's.
_NCCL_LOG_TAIL = r":\d+:\d+ \[\d+\] "
_NCCL_LOG = re.compile(r"[A-Za-z][\w.-]*" + _NCCL_LOG_TAIL)
# At a line's start a host name may begin with a digit (`8h200-2:6831:6840 [0] NCCL INFO ...`); mid-line (the
# fallback above) it must not, or a glued row's last number would be taken for one.
_NCCL_LOG_HOSTS = re.compile(r"(?m)^" + _PREFIX_RE + r"(\w[\w.-]*)" + _NCCL_LOG_TAIL)
# NCCL's communicator line: `comm 0x.. rank 0 nranks 16 cudaDev 0 ..` (`nRanks 16 nNodes 2 ..` since 2.19)
_NCCL_COMM = re.compile(r"NCCL INFO (?:\w+ )?comm \S+ rank \d+ n[Rr]anks (\d+)(?: nNodes (\d+))?")
_HEADER = re.compile(r"^#\s*(?:size|bytes)\s+.*\bbusbw\b")
_TEST_NAME = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)*)_perf(?:_mpi)?\b")
_DEVICE = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)"
                     r"\s+\[[^\]]*\]\s*(.*)$")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_TIME_COLUMNS = ("time", "cputime")
_WRONG_COLUMNS = ("#wrong", "wrong")
_ERROR_COLUMNS = ("error", "res")  # before Aug 2022: a float max error, not a count


@dataclasses.dataclass
class Measure:
    """One placement (out-of-place or in-place) of one size."""

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None = None  # #wrong count; None when not checked (N/A) or the log has the float error column
    error: float | None = None  # the pre-2022 float error column
    extra: dict[str, float | None] = dataclasses.field(default_factory=dict)  # i_min, i_max, #bitdiff, ...


@dataclasses.dataclass
class Row:
    size: int
    count: int | None
    dtype: str | None
    redop: str | None
    root: int | None
    out_of_place: Measure | None
    in_place: Measure | None
    timestamp: str | None = None

    def measures(self) -> list[Measure]:
        return [m for m in (self.out_of_place, self.in_place) if m is not None]


@dataclasses.dataclass
class NcclTest:
    name: str | None  # e.g. "all_reduce"; None when the log does not say
    rows: list[Row]
    source: str = ""
    out_of_bounds: int | None = None  # footer "Out of bounds values"
    avg_busbw_gbs: float | None = None  # footer "Avg bus bandwidth"
    hosts: list[str] = dataclasses.field(default_factory=list)  # one per listed rank, from the "Using devices" lines
    devices: list[str] = dataclasses.field(default_factory=list)
    transport: str | None = None  # efa / tcp / ib, from NCCL INFO lines (toolkit.reports.transport)
    format: str = ""  # "text: <header columns>" or "json v<version>"
    device_ranks: list[int] = dataclasses.field(default_factory=list)  # the rank number of each device line
    nccl_nranks: int | None = None  # from NCCL's `comm .. nranks N` lines
    nccl_nnodes: int | None = None  # from NCCL's `comm .. nNodes N` lines (NCCL >= 2.19)

    @property
    def devices_complete(self) -> bool:
        """The device lines list every rank: 0..N-1, and N agrees with NCCL's nranks where the log has it."""
        listed = len(self.device_ranks)
        return bool(listed) and self.device_ranks == list(range(listed)) and self.nccl_nranks in (None, listed)

    @property
    def ranks(self) -> int | None:
        return self.nccl_nranks or (len(self.device_ranks) if self.devices_complete else None)

    @property
    def nodes(self) -> int | None:
        return self.nccl_nnodes or (len(set(self.hosts)) if self.devices_complete else None)

    @property
    def count_note(self) -> str | None:
        """Why the rank or node count is unknown (None when both are known)."""
        if self.ranks is not None and self.nodes is not None:
            return None
        listed = len(self.device_ranks)
        shown = (f"{listed} device line(s) for ranks {_spans(self.device_ranks)}" if listed else
                 "no device lines ('#  Rank N ... on HOST device D')")
        if self.nccl_nranks:
            return f"{shown} of NCCL's nranks {self.nccl_nranks}: the node count is not in the log"
        return f"{shown}{': the list is incomplete' if listed else ''} and no NCCL nranks line"


@dataclasses.dataclass
class Verdict:
    status: Status
    reason: str
    floor_busbw_gbs: float | None = None
    measured_busbw_gbs: float | None = None
    source: str | None = None
    size_bytes: int | None = None  # the message size judged: the largest the run reached
    estimate: bool = False  # the floor is an estimate, not from a measured run: below it is WARN, not FAIL


def _spans(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2, 5-6'."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


# ---- text ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Layout:
    keys: list[str]
    groups: list[list[str]]
    timestamp: bool

    @classmethod
    def from_header(cls, line: str) -> _Layout | None:
        names = line.lstrip("#").split()
        timestamp = bool(names) and names[-1] == "timestamp"
        if timestamp:
            names = names[:-1]
        starts = [i for i, n in enumerate(names) if n in _TIME_COLUMNS]
        if not starts:
            return None
        groups = [names[a:b] for a, b in zip(starts, starts[1:] + [len(names)], strict=True)]
        if not all({"algbw", "busbw"} <= set(g) for g in groups):
            return None
        return cls(names[: starts[0]], groups, timestamp)

    @property
    def width(self) -> int:
        return len(self.keys) + sum(len(g) for g in self.groups) + (2 if self.timestamp else 0)

    def parse(self, tokens: list[str]) -> Row | None:
        if len(tokens) != self.width:
            return None
        try:
            keys = dict(zip(self.keys, tokens, strict=False))  # the width check above: tokens may be longer
            size = int(keys.get("size", keys.get("bytes", "")))
            count = keys.get("count", keys.get("N"))
            root = keys.get("root")
            pos = len(self.keys)
            measures = []
            for group in self.groups:
                measures.append(_measure(group, tokens[pos: pos + len(group)]))
                pos += len(group)
            return Row(size=size, count=int(count) if count is not None else None, dtype=keys.get("type"),
                       redop=keys.get("redop"), root=int(root) if root is not None else None,
                       out_of_place=measures[0], in_place=measures[1] if len(measures) > 1 else None,
                       timestamp=" ".join(tokens[pos:]) if self.timestamp else None)
        except ValueError:
            return None


def _number(token: str) -> float | None:
    """A table cell: N/A is None; the old error column marks a failed check with a trailing '*'."""
    if token == "N/A":
        return None
    return float(token.rstrip("*"))


def _measure(names: list[str], tokens: list[str]) -> Measure:
    cells = dict(zip(names, tokens, strict=True))
    time_name = next(n for n in names if n in _TIME_COLUMNS)
    wrong_name = next((n for n in names if n in _WRONG_COLUMNS), None)
    error_name = next((n for n in names if n in _ERROR_COLUMNS), None)
    wrong = _number(cells[wrong_name]) if wrong_name else None
    skip = {time_name, "algbw", "busbw", wrong_name, error_name}
    return Measure(time_us=float(cells[time_name]), algbw_gbs=float(cells["algbw"]), busbw_gbs=float(cells["busbw"]),
                   wrong=int(wrong) if wrong is not None else None,
                   error=_number(cells[error_name]) if error_name else None,
                   extra={n: _number(cells[n]) for n in names if n not in skip})


def _nccl_log_pattern(text: str) -> re.Pattern:
    """NCCL's log prefix with this file's host names, so that a log line glued to a half-written row
    (`... float     sumip-10-0-1-11:4100:4163 [0] NCCL INFO ...`) is cut where the host name starts."""
    hosts = sorted(set(_NCCL_LOG_HOSTS.findall(text)), key=len, reverse=True)
    if not hosts:
        return _NCCL_LOG
    return re.compile("(?:" + "|".join(map(re.escape, hosts)) + ")" + _NCCL_LOG_TAIL)


def _clean(raw: str, nccl_log: re.Pattern) -> tuple[str, bool]:
    """The line without launcher prefix and NCCL log text; and whether NCCL log text was cut off."""
    line = _PREFIX.sub("", raw.rstrip("\r\n"), count=1)
    match = nccl_log.search(line)
    if match:
        return line[: match.start()], True
    return line, False


def _test_name(text: str) -> str | None:
    match = _TEST_NAME.search(text)
    return match.group(1) if match else None


def parse_text(text: str, source: str = "") -> list[NcclTest]:
    """Every test in an nccl-tests text log (possibly with launcher prefixes and NCCL INFO lines)."""
    tests: list[NcclTest] = []
    text = ANSI.sub("", text)  # Ray/SkyPilot colour their prefixes
    transport = nccl_transport(text).name
    layout: _Layout | None = None
    current: NcclTest | None = None
    pending_name: str | None = None
    pending_devices: list[tuple[int, str, str]] = []
    pending_comm: list[tuple[int, int | None]] = []  # NCCL (nranks, nNodes) lines before the next test's header
    partial = ""  # a row split by NCCL log text, waiting for its remainder
    nccl_log = _nccl_log_pattern(text)
    for raw in text.splitlines():
        if comm := _NCCL_COMM.search(raw):
            counts = (int(comm.group(1)), int(comm.group(2)) if comm.group(2) else None)
            if current is not None and not pending_devices and pending_name is None:
                _add_comm(current, [counts])  # e.g. `Destroy COMPLETE` after the table
            else:
                pending_comm.append(counts)
        line, had_log = _clean(raw, nccl_log)
        stripped = line.strip()
        if stripped.startswith("#"):
            partial = ""
            if _HEADER.match(stripped):
                layout = _Layout.from_header(stripped)
                if layout is None:
                    continue
                current = NcclTest(name=pending_name, rows=[], source=source, transport=transport,
                                   hosts=[h for _, h, _ in pending_devices], devices=[d for _, _, d in pending_devices],
                                   device_ranks=[r for r, _, _ in pending_devices],
                                   format="text: " + " | ".join([" ".join(layout.keys)]
                                                                + [" ".join(g) for g in layout.groups])
                                   + (" | timestamp" if layout.timestamp else ""))
                _add_comm(current, pending_comm)
                tests.append(current)
                pending_name, pending_devices, pending_comm = None, [], []
            elif m := _DEVICE.match(stripped):
                pending_devices.append((int(m.group(1)), m.group(2), m.group(4).strip()))
            elif (m := _OUT_OF_BOUNDS.match(stripped)) and current is not None:
                current.out_of_bounds = int(m.group(1))
            elif (m := _AVG_BUSBW.match(stripped)) and current is not None:
                current.avg_busbw_gbs = _number(m.group(1))
                layout = None  # the footer closes the table
            elif "concluded" not in stripped and (name := _test_name(stripped)):
                pending_name = name
            continue
        if not stripped:
            continue
        if layout is None or current is None:
            if not had_log and (name := _test_name(stripped)):  # e.g. the launch command line
                pending_name = name
            continue
        tokens = (partial + " " + stripped).split() if partial else stripped.split()
        if len(tokens) < layout.width and _starts_row(tokens):
            partial = " ".join(tokens)
            continue
        partial = ""
        row = layout.parse(tokens)
        if row is not None:
            current.rows.append(row)
    return [t for t in tests if t.rows]


def _add_comm(test: NcclTest, counts: list[tuple[int, int | None]]) -> None:
    """Take the largest communicator NCCL reported (nccl-tests may also split the world one)."""
    for nranks, nnodes in counts:
        if test.nccl_nranks is None or nranks > test.nccl_nranks:
            test.nccl_nranks, test.nccl_nnodes = nranks, nnodes


def _starts_row(tokens: list[str]) -> bool:
    return bool(tokens) and tokens[0].isdigit()


# ---- JSON (-J, nccl-tests >= 2.17.3) ------------------------------------------------------------------------

def _json_measure(obj: dict | None, per_iter: dict | None) -> Measure | None:
    if not obj:
        return None
    wrong = obj.get("nwrong")
    extra: dict[str, float | None] = {}
    if per_iter:
        extra = {f"i_{k[:-3]}": v for k, v in per_iter.items() if k.endswith("_us") and isinstance(v, (int, float))}
    return Measure(time_us=float(obj.get("time", obj.get("cpu_time", "nan"))), algbw_gbs=float(obj["alg_bw"]),
                   busbw_gbs=float(obj["bus_bw"]), wrong=int(wrong) if wrong is not None else None, extra=extra)


def parse_json(data: dict, source: str = "") -> list[NcclTest]:
    """The test in an nccl-tests `-J` JSON file (one test per file)."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise HpcError(f"{source or 'JSON input'} is not an nccl-tests -J result (no 'results' list)",
                       fix="pass the file nccl-tests wrote with -J FILE, or its text output")
    rows = []
    for r in data["results"]:
        root = str(r.get("root", "")).strip()
        rows.append(Row(size=int(r["size"]), count=int(r["count"]) if "count" in r else None, dtype=r.get("type"),
                        redop=r.get("redop"), root=int(root) if root.lstrip("-").isdigit() else None,
                        out_of_place=_json_measure(r.get("out_of_place"), r.get("out_of_place_per_iter")),
                        in_place=_json_measure(r.get("in_place"), r.get("in_place_per_iter"))))
    devices = (data.get("config") or {}).get("devices") or data.get("devices") or []
    args = data.get("args") or []
    oob = data.get("out_of_bounds") or {}
    avg = data.get("average_bus_bandwidth") or {}
    return [NcclTest(name=_test_name(Path(args[0]).name) if args else None, rows=rows, source=source,
                     out_of_bounds=oob.get("count"), avg_busbw_gbs=_json_float(avg.get("bandwidth")),
                     hosts=[d.get("hostname", "") for d in devices],
                     devices=[d.get("device_info", "") for d in devices],
                     device_ranks=[d.get("rank", i) for i, d in enumerate(devices)],
                     format=f"json v{data.get('version', '?')}")]


def _json_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def parse_file(path: str | Path) -> list[NcclTest]:
    """Every test in a log or -J file; an HpcError when the file is missing or holds no nccl-tests table."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise HpcError(f"no such file: {path}", fix="check the path of the nccl-tests log") from None
    except IsADirectoryError:
        raise HpcError(f"{path} is a directory, not a log file", fix="pass the log file itself") from None
    tests = parse_text(text, str(path))
    if not tests and text.lstrip().startswith("{"):  # -J output (a text log may start with `{` too)
        first = text.lstrip().split("\n", 1)[0]
        if '"event"' in first:  # JSON lines of a training log (toolkit.workloads.train_log), not nccl-tests -J
            raise HpcError(f"{path} is a training log (JSON lines of events), not nccl-tests output",
                           fix=f"read it with `hpc report run {path}`") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HpcError(f"{path} looks like JSON but does not parse: {exc}",
                           fix="the run may have been cut short; use its text output instead") from None
        tests = parse_json(data, str(path))
    if not tests:
        raise HpcError(f"no nccl-tests results found in {path}",
                       fix="pass the stdout of an nccl-tests binary (or -J JSON); its table header starts '#  size'")
    return tests


# ---- summary and verdict -----------------------------------------------------------------------------------

def summarize(test: NcclTest) -> dict:
    """Max and average busbw (average as nccl-tests computes it: over every out-of-place and in-place row),
    wrong-value count and the largest float error (old format)."""
    measures = [m for r in test.rows for m in r.measures()]
    best = max(((m.busbw_gbs, r.size) for r in test.rows for m in r.measures()), default=(None, None))
    wrongs = [m.wrong for m in measures if m.wrong is not None]
    errors = [m.error for m in measures if m.error is not None]
    computed_avg = sum(m.busbw_gbs for m in measures) / len(measures) if measures else None
    return {
        "test": test.name, "source": test.source, "format": test.format,
        "ranks": test.ranks, "nodes": test.nodes, "count_note": test.count_note, "transport": test.transport,
        "max_busbw_gbs": best[0], "max_busbw_size": best[1],
        "avg_busbw_gbs": test.avg_busbw_gbs if test.avg_busbw_gbs is not None else computed_avg,
        "wrong_values": sum(wrongs) if wrongs else (None if not errors else 0),
        "max_error": max(errors) if errors else None,
        "out_of_bounds": test.out_of_bounds,
    }


def judge_reference(test: NcclTest, ref: CollectiveReference, ranks: int | None = None) -> Verdict:
    """Against a family's published run (Family.collective_reference): PASS when the bus bandwidth at its message
    size is nearer its expected-state figure; FAIL (with the fix) when nearer the failure-state figure or when
    values are wrong; NO-VERDICT when the run is not the reference's shape."""
    summary = summarize(test)
    wrong, out_of_bounds = summary["wrong_values"] or 0, test.out_of_bounds or 0
    if wrong or out_of_bounds:
        return Verdict("FAIL", f"{wrong} wrong values, {out_of_bounds} sizes out of bounds: "
                               "the collective returned corrupt data")
    if test.name is None or test.name not in ref.figures_mbs:
        return Verdict("NO-VERDICT", f"{ref.called} has figures for {', '.join(ref.figures_mbs)}; this test is "
                                     f"{test.name or 'unnamed'}")
    ranks = ranks or test.ranks
    if ranks != ref.ranks:
        return Verdict("NO-VERDICT", f"{ref.called} measured {ref.ranks} {ref.devices} ({ref.nodes} nodes); this run "
                                     f"has {ranks or 'an unknown number of'} ranks (pass --nodes N if the log lacks "
                                     "them)")
    row = next((r for r in test.rows if r.size == ref.size_bytes), None)
    failed, expected = ref.figures_mbs[test.name]
    mib = ref.size_bytes // 2**20
    mb = f"{mib} MB"
    if row is None:
        return Verdict("NO-VERDICT", f"no {ref.size_bytes} B ({mb}) row: run with -b <= {mib}M and -e >= {mib}M",
                       expected / 1000, source=ref.source)
    measured = max(m.busbw_gbs for m in row.measures()) * 1000
    figures = (f"{measured:,.0f} MB/s at {mb} vs {ref.called}'s {expected:,} with {ref.expected}, {failed:,} "
               "without")
    if measured >= (failed + expected) / 2:
        return Verdict("PASS", f"{figures}: {ref.expected} in effect", expected / 1000, measured / 1000, ref.source)
    return Verdict("FAIL", f"{figures}: near the without-{ref.expected} figure, {ref.failure_means}; fix: {ref.fix}",
                   expected / 1000, measured / 1000, ref.source)


def verdict_for(test: NcclTest, instance_type: str | None, nodes: int | None,
                transport: str | None = None) -> Verdict:
    """The verdict of one collectives test: against the published run of the instance's accelerator family where it
    has one (Family.collective_reference), else the catalog's NCCL floor (judge, over `transport` when the run's
    queue says which)."""
    from toolkit.catalog import instance

    if instance_type is not None:
        it = instance(instance_type)
        accel = family_or_none(it)
        if accel is not None and accel.collective_reference is not None:
            return judge_reference(test, accel.collective_reference, nodes * it.gpus if nodes else None)
    return judge(test, instance_type, nodes, transport)


def judge(test: NcclTest, instance_type: str | None = None, nodes: int | None = None,
          transport: str | None = None) -> Verdict:
    """PASS / WARN / FAIL / NO-VERDICT of one test against the catalog floor.

    Wrong values are a FAIL whatever the bandwidth. The floor applies to all-reduce on its min_nodes..max_nodes
    nodes. The run is judged at the largest message size it ran (the best of its out-of-place and in-place busbw
    there), against the floor measured at the largest size up to that one: busbw still rises past 1 GiB on fast
    fabrics, and a healthy older stack can be slow at 1 GiB and at full speed at 2 GiB. Below a floor from a
    measured run is FAIL; below an estimated floor is WARN. The transport judged is the one given, else the
    instance's own (EFA if it has it), so that an EFA instance that fell back to TCP sockets does not pass a TCP
    floor.
    """
    from toolkit.catalog import instance, nccl_floor, nccl_floors_for

    summary = summarize(test)
    wrong, out_of_bounds = summary["wrong_values"] or 0, test.out_of_bounds or 0
    if wrong or out_of_bounds:
        return Verdict("FAIL", f"{wrong} wrong values, {out_of_bounds} sizes out of bounds: "
                               "the collective returned corrupt data")
    if instance_type is None:
        return Verdict("NO-VERDICT", "no instance type given (--instance TYPE) to pick a floor")
    nodes, how = nodes or test.nodes, ""
    if nodes is None:
        # NCCL ranks are GPUs: more ranks than one instance has GPUs means at least that many nodes.
        gpus = instance(instance_type).gpus
        if test.ranks and gpus and test.ranks > gpus:
            nodes, how = -(-test.ranks // gpus), f"at least, from {test.ranks} ranks / {gpus} GPUs per node"
        else:
            return Verdict("NO-VERDICT", f"the node count is unknown ({test.count_note}); pass --nodes N")
    if nodes < 2:
        return Verdict("NO-VERDICT", "one node: NVLink only, the network was not measured")
    if test.name not in (None, "all_reduce"):
        return Verdict("NO-VERDICT", f"floors are for all_reduce; this test is {test.name}")
    expected = transport or ("efa" if instance(instance_type).has_efa else "tcp")
    floors = nccl_floors_for(instance_type, expected)
    if not floors:
        return Verdict("NO-VERDICT", f"no published floor for {instance_type} over {expected.upper()} in the catalog")
    floor = nccl_floor(instance_type, expected, nodes)
    if floor is None:
        counts = ", ".join(f"{f.min_nodes}-{f.max_nodes or ''}" for f in floors)
        return Verdict("NO-VERDICT", f"no floor for {nodes} nodes (the catalog's floors cover {counts} nodes)")
    largest = max(r.size for r in test.rows)
    at = floor.at(largest)
    if at is None:
        smallest = floor.sizes[0].bytes
        return Verdict("NO-VERDICT", f"largest message {largest} B is under the floor's smallest measured size, "
                                     f"{size_text(smallest)} (run with -e {size_flag(smallest)} or more)",
                       floor.sizes[0].floor_busbw_gbs, source=floor.source, size_bytes=largest, estimate=floor.estimate)
    measured = max(m.busbw_gbs for r in test.rows if r.size == largest for m in r.measures())
    note = ""
    if test.transport and test.transport != expected:
        note = (f"; NCCL used {test.transport.upper()}, not {expected.upper()}: check the EFA stack (aws-ofi-nccl, "
                "FI_PROVIDER)")
    status: Status = "PASS" if measured >= at.floor_busbw_gbs else "WARN" if floor.estimate else "FAIL"
    kind = "estimated floor (not from a measured run: below it warns)" if floor.estimate else "floor"
    reason = (f"busbw {measured:g} GB/s at {size_text(largest)} (the largest size run) vs {kind} "
              f"{at.floor_busbw_gbs:g} GB/s at {size_text(at.bytes)} ({instance_type}, {expected.upper()}, "
              f"{nodes} nodes{f' ({how})' if how else ''}){note}")
    return Verdict(status, reason, at.floor_busbw_gbs, measured, floor.source, largest, floor.estimate)


def size_text(size: int) -> str:
    """A message size for people: 8 GiB, 256 MiB, 2048 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def size_flag(size: int) -> str:
    """A size in nccl-tests' -e spelling (K, M, G are powers of 1024)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def report(paths: list[str | Path], instance_type: str | None = None, nodes: int | None = None,
           transport: str | None = None, verdict: Callable[..., Verdict] | None = None) -> tuple[dict, list[NcclTest]]:
    """Every test in the given logs with its rows, summary and verdict; the overall status is FAIL if any test
    fails or any file cannot be read (listed under `errors`, the others are still reported), else WARN if any
    is under an estimated floor, else PASS if any passes, else NO-VERDICT. Returns the JSON-ready report and
    the parsed tests. When no file can be read at all, the (first) file's error is raised.
    `verdict(test, instance_type, nodes, transport)`: judge() unless given (verdict_for also judges a family's
    runs against its published reference)."""
    from toolkit.catalog import instance

    if transport not in (None, "efa", "tcp"):
        raise UsageError(f"unknown transport {transport!r}", fix="use --transport efa or --transport tcp")
    if instance_type is not None:
        instance(instance_type)
    tests: list[NcclTest] = []
    errors: list[tuple[str, HpcError]] = []
    for path in paths:
        try:
            tests += parse_file(path)
        except HpcError as exc:
            errors.append((str(path), exc))
    if errors and not tests:
        raise errors[0][1]
    entries = []
    for test in tests:
        judged = (verdict or judge)(test, instance_type, nodes, transport)
        entries.append({**summarize(test), "verdict": dataclasses.asdict(judged),
                        "rows": [dataclasses.asdict(r) for r in test.rows]})
    statuses = {e["verdict"]["status"] for e in entries}
    status = ("FAIL" if "FAIL" in statuses or errors else "WARN" if "WARN" in statuses
              else "PASS" if "PASS" in statuses else "NO-VERDICT")
    return {"status": status, "instance_type": instance_type, "tests": entries,
            "errors": [{"source": source, "error": exc.message, "fix": exc.fix} for source, exc in errors]}, tests


def _shape(test: NcclTest, nodes: int | None) -> tuple[int, str, int, float] | None:
    """(nodes, test, largest size, best busbw there): what a fleet baseline is kept and judged by."""
    nodes = nodes or test.nodes
    if nodes is None or not test.rows:
        return None
    largest = max(r.size for r in test.rows)
    measured = max(m.busbw_gbs for r in test.rows if r.size == largest for m in r.measures())
    return nodes, test.name or "all_reduce", largest, measured


def fleet_verdict(records: list[dict]) -> Callable[..., Verdict]:
    """A verdict (report()'s `verdict`) against the fleet's own baseline (toolkit.reports.baseline) where the fleet
    has enough runs of the test's shape, else verdict_for's published floor or reference, saying which."""
    from toolkit.reports.baseline import MIN_RUNS, learn

    def verdict(test: NcclTest, instance_type: str | None, nodes: int | None, transport: str | None) -> Verdict:
        published = verdict_for(test, instance_type, nodes, transport)
        shape = _shape(test, nodes)
        if instance_type is None or shape is None or (summarize(test)["wrong_values"] or test.out_of_bounds):
            return published
        count, name, size, measured = shape
        base = learn(records, instance_type, count, name, size)
        if base is None or not base.enough:
            runs = base.runs if base else 0
            return dataclasses.replace(published, reason=f"{published.reason} [published floor: the fleet has {runs} "
                                                         f"of the {MIN_RUNS} runs of this shape a baseline needs]")
        status: Status = "PASS" if measured >= base.bound_gbs else "FAIL"
        return Verdict(status, f"busbw {measured:.3g} GB/s at {size_text(size)} vs {base.describe()}",
                       base.bound_gbs, measured, "fleet", size)

    return verdict


def fleet_samples(tests: list[NcclTest], verdicts: list[dict], instance_type: str, nodes: int | None,
                  job: str | None = None) -> list[dict]:
    """The ledger's baseline records of a report's tests that did not fail (toolkit.node.ledger.baseline_record)."""
    from toolkit.node.ledger import baseline_record

    out = []
    for test, judged in zip(tests, verdicts, strict=True):
        shape = _shape(test, nodes)
        if shape is None or judged["status"] == "FAIL":
            continue
        count, name, size, measured = shape
        out.append(baseline_record(instance_type, count, name, size, measured, job=job or test.source,
                                   source="nccl-report", hosts=sorted(set(test.hosts)) if test.hosts else ()))
    return out
