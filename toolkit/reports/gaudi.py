"""Collectives on Habana Gaudi (dl1.24xlarge) judged against Intel's DL1 EFA peer-direct post: the reports' module
of the Gaudi family (toolkit.accelerators.gaudi), whose verdict_for every collectives report asks.

The post measured 32 HPUs (4 nodes) at 32 MB messages, without and with EFA peer-direct (MB/s):
all-reduce 12,110 -> 21,136, all-gather 20,299 -> 41,082, reduce-scatter 9,249 -> 17,418. Peer-direct is the
expected state (the toolkit sets it up on dl1 queues with EFA); a result nearer the without figure than the
with figure means HCCL is staging through host memory, and is flagged with the fix.

The logs are nccl-tests-format tables (our collectives workload with --device hpu prints them) read by
toolkit.reports.nccl. The post's figures are compared with the bus bandwidth column (what Habana's hccl_demo
calls NW bandwidth: algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the others), GB/s x 1000 = MB/s.
"""

from __future__ import annotations

from toolkit.reports.nccl import NcclTest, Verdict, summarize

SOURCE = "Intel's DL1 EFA peer-direct post: 32 HPUs (4 x dl1.24xlarge), 32 MB messages, SynapseAI 1.8.0"
POST_RANKS = 32
POST_SIZE = 32 * 2**20
# collective: (without peer-direct, with peer-direct) in MB/s
PEER_DIRECT_MBS = {"all_reduce": (12110, 21136), "all_gather": (20299, 41082), "reduce_scatter": (9249, 17418)}
FIX = ("enable EFA peer-direct: RDMAV_FORK_SAFE=1 and FI_EFA_USE_DEVICE_RDMA=1 on SynapseAI >= 1.8.0 (libfabric "
       ">= 1.16.1, Linux >= 5.12), EFA enabled on the queue, and HCCL_OVER_OFI unset (it forces the host-memory "
       "path); `hpc recipes render` sets the variables for dl1 queues with EFA")


def judge_gaudi(test: NcclTest, ranks: int | None = None) -> Verdict:
    """PASS when the 32 MB bus bandwidth is nearer the post's peer-direct figure; FAIL (with the fix) when
    nearer the without figure or when values are wrong; NO-VERDICT when the run is not the post's shape."""
    summary = summarize(test)
    wrong, out_of_bounds = summary["wrong_values"] or 0, test.out_of_bounds or 0
    if wrong or out_of_bounds:
        return Verdict("FAIL", f"{wrong} wrong values, {out_of_bounds} sizes out of bounds: "
                               "the collective returned corrupt data")
    if test.name not in PEER_DIRECT_MBS:
        return Verdict("NO-VERDICT", f"the post has figures for {', '.join(PEER_DIRECT_MBS)}; this test is "
                                     f"{test.name or 'unnamed'}")
    ranks = ranks or test.ranks
    if ranks != POST_RANKS:
        return Verdict("NO-VERDICT", f"the post measured {POST_RANKS} HPUs (4 nodes); this run has "
                                     f"{ranks or 'an unknown number of'} ranks (pass --nodes N if the log lacks them)")
    row = next((r for r in test.rows if r.size == POST_SIZE), None)
    without, with_pd = PEER_DIRECT_MBS[test.name]
    if row is None:
        return Verdict("NO-VERDICT", f"no {POST_SIZE} B (32 MB) row: run with -b <= 32M and -e >= 32M",
                       with_pd / 1000, source=SOURCE)
    measured = max(m.busbw_gbs for m in row.measures()) * 1000
    figures = f"{measured:,.0f} MB/s at 32 MB vs the post's {with_pd:,} with peer-direct, {without:,} without"
    if measured >= (without + with_pd) / 2:
        return Verdict("PASS", f"{figures}: peer-direct in effect", with_pd / 1000, measured / 1000, SOURCE)
    return Verdict("FAIL", f"{figures}: near the without-peer-direct figure, HCCL is staging through host memory; "
                           f"fix: {FIX}", with_pd / 1000, measured / 1000, SOURCE)


def is_gaudi(instance_type: str | None) -> bool:
    from toolkit.accelerators import family_or_none
    from toolkit.accelerators.gaudi import GAUDI
    from toolkit.catalog import instance

    return instance_type is not None and family_or_none(instance(instance_type)) is GAUDI


def verdict_for(test: NcclTest, instance_type: str | None, nodes: int | None,
                transport: str | None = None) -> Verdict:
    """The verdict of one collectives test: the DL1 post's table on Gaudi, the catalog's NCCL floor elsewhere
    (over `transport` when the run's queue says which, see toolkit.reports.nccl.judge)."""
    from toolkit.catalog import instance
    from toolkit.reports.nccl import judge

    if instance_type is not None and is_gaudi(instance_type):
        return judge_gaudi(test, nodes * instance(instance_type).gpus if nodes else None)
    return judge(test, instance_type, nodes, transport)
