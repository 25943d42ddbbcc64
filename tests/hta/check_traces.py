"""Runs Holistic Trace Analysis on a directory of occl trace files and prints what it found, one
fact per line, for tests/tests/trace_hta.rs to assert on.

usage: check_traces.py <trace dir>
"""

import logging
import sys

import pandas as pd

# HTA logs every parsed file at INFO; the test reads stdout only.
logging.disable(logging.INFO)

from hta.common.trace import Trace  # noqa: E402
from hta.trace_analysis import TraceAnalysis  # noqa: E402
from hta.utils.utils import get_kernel_type, KernelType  # noqa: E402


def comm_kernels(t: Trace, rank: int) -> pd.DataFrame:
    """The GPU rows of a rank that HTA's kernel classifier calls communication."""
    df = t.get_trace(rank)
    sym = t.symbol_table.get_sym_table()
    gpu = df[df["stream"].ne(-1)].copy()
    gpu["s_name"] = gpu["name"].apply(lambda i: sym[i])
    kind = gpu["s_name"].apply(get_kernel_type)
    return gpu[kind == KernelType.COMMUNICATION.name]


def main() -> int:
    trace_dir = sys.argv[1]
    # Default loading: with >= 2 ProfilerSteps, HTA keeps only kernels whose call row (same
    # correlation) lies before the last step's start.
    a = TraceAnalysis(trace_dir=trace_dir)
    ranks = a.t.get_ranks()
    print("ranks", *ranks)

    tb = a.get_temporal_breakdown(visualize=False)
    for _, row in tb.iterrows():
        print(
            f"temporal rank={int(row['rank'])} idle_us={int(row['idle_time(us)'])} "
            f"compute_us={int(row['compute_time(us)'])} non_compute_us={int(row['non_compute_time(us)'])} "
            f"non_compute_pct={row['non_compute_time_pctg']}"
        )

    ov = a.get_comm_comp_overlap(visualize=False)
    for _, row in ov.iterrows():
        print(f"overlap rank={int(row['rank'])} pct={row['comp_comm_overlap_pctg']}")

    kt, kd = a.get_gpu_kernel_breakdown(visualize=False)
    for _, row in kt.iterrows():
        print(f"kernel_type {row['kernel_type']} sum_us={int(row['sum'])} pct={row['percentage']}")
    comm_names = sorted(set(kd[kd["kernel_type"] == KernelType.COMMUNICATION.name]["name"]))
    print("kernel_breakdown_comm_names", *comm_names)

    for r in ranks:
        k = comm_kernels(a.t, r)
        print(f"comm_kernels rank={r} count={len(k)} iterations={sorted(int(i) for i in k['iteration'].unique())}")

    print("profiler_steps", *a.get_profiler_steps())
    stragglers = a.get_potential_stragglers(num_candidates=1)
    print("stragglers", *stragglers)

    # Everything, last step included: the count of every collective the job ran.
    b = TraceAnalysis(trace_dir=trace_dir, include_last_profiler_step=True)
    for r in b.t.get_ranks():
        print(f"comm_kernels_all rank={r} count={len(comm_kernels(b.t, r))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
