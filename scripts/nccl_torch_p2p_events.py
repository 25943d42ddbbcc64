"""KernelCh events of PyTorch's grouped sends and receives, seen by an NCCL profiler plugin.

Two ranks (torch.multiprocessing; GPU rank % the GPUs there are, so one GPU serves both on
occl, whereas NVIDIA's NCCL needs two) run `dist.batch_isend_irecv` over K tensors each way, one
group of sends to and receives from the other rank, then destroy the process group. The
library is whichever libnccl.so.2 PyTorch loads (LD_PRELOAD occl's for occl's rows). Every rank
loads the v5 recorder plugin (telemetry/tests/plugins/recorder_v5.c, or RECORDER_SRC, compiled
here with cc; recorder.h beside it) via NCCL_PROFILER_PLUGIN, with P2p, KernelCh and KernelLaunch wanted, and the parent process reads
its logs: per P2p event its channel count (nChannels) and the channel ids of the KernelCh
events whose parent it is.

NCCL's model: a KernelCh per work item, an operation on a channel. occl runs a group as one
launch whose connections (peer, direction) have channels of their own, one operation after
another on them; each operation gets a KernelCh per channel of its connection
(core/src/cuda/events.rs). With CHECK=1 the script fails unless every P2p event has nChannels
KernelCh events on distinct channels, whichever library runs. Channel ids differ: NVIDIA's are
the communicator's channels its p2p work ran on (16..31 of 32 on 2×H200), occl's count from 0
within the connection.

    python3 scripts/nccl_torch_p2p_events.py [K ...]     (default K: 2 16; LIB names the rows)
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 4  # MiB each way per rank, split over K tensors
P2P, KERNEL_CH = 0x4, 0x40
MASK = P2P | KERNEL_CH | 0x800  # and KernelLaunch


def build_plugin(out_dir):
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.environ.get("RECORDER_SRC") or os.path.join(here, "..", "telemetry", "tests", "plugins", "recorder_v5.c")
    lib = os.path.join(out_dir, "librecorder.so")
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-pthread", "-o", lib, src], check=True)
    return lib


def rank_main(rank, world, port, ks):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    peer = 1 - rank
    for k in ks:
        n = MIB * (1 << 20) // 4 // k
        send = [torch.full((n,), float(rank * 100 + j), device=dev) for j in range(k)]
        recv = [torch.empty(n, device=dev) for _ in range(k)]
        ops = [dist.P2POp(dist.isend, t, peer) for t in send] + [dist.P2POp(dist.irecv, t, peer) for t in recv]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        torch.cuda.synchronize()
        wrong = sum(int((t != float(peer * 100 + j)).sum()) for j, t in enumerate(recv))
        if wrong:
            raise SystemExit(f"rank {rank}: {wrong} wrong elements after the group of {k}")
    dist.destroy_process_group()


def parse(path):
    """P2p events in start order: (func, peer, nch, [KernelCh channel ids])."""
    p2p, chans = {}, {}
    for line in open(path):
        tok = line.split()
        if not tok or tok[0] != "start":
            continue
        kv = dict(t.split("=", 1) for t in tok[1:] if "=" in t)
        ty, h = int(kv["type"]), int(kv["handle"])
        if ty == P2P:
            p2p[h] = (kv["func"], int(kv["peer"]), int(kv["nch"]))
        elif ty == KERNEL_CH:
            chans.setdefault(int(kv["parent"]), []).append(int(kv["ch"]))
    return [(f, peer, nch, sorted(chans.get(h, []))) for h, (f, peer, nch) in sorted(p2p.items())]


def check(events, ks):
    """Each group has 2K P2p events, each with a KernelCh per channel."""
    errors = []
    if len(events) != 2 * sum(ks):
        errors.append(f"{len(events)} P2p events, want {2 * sum(ks)} (groups of {ks}, each way)")
    for i, (func, peer, nch, ids) in enumerate(events):
        if nch == 0 or len(ids) != nch or len(set(ids)) != nch:
            errors.append(f"P2p #{i}, {func} with peer {peer}: {nch} channels, KernelCh {ids}")
    return errors


def main():
    ks = [int(a) for a in sys.argv[1:]] or [2, 16]
    lib = os.environ.get("LIB", "occl")
    tmp = tempfile.mkdtemp(prefix="occl-p2p-events-")
    os.environ.update(
        NCCL_PROFILER_PLUGIN=build_plugin(tmp),
        OCCL_TEST_PLUGIN_LOG=os.path.join(tmp, "rec"),
        OCCL_TEST_PLUGIN_MASK=str(MASK),
    )
    mp.start_processes(rank_main, args=(2, 29541, ks), nprocs=2, start_method="spawn")
    # A log per communicator and rank: PyTorch may make more than one; the groups' P2p events
    # are in one per rank.
    logs = [(os.path.basename(p), parse(p)) for p in sorted(glob.glob(os.path.join(tmp, "rec-*.log")))]
    logs = [(name, events) for name, events in logs if events]
    errors = [] if len(logs) == 2 else [f"{len(logs)} recorder logs with P2p events in {tmp}, want one per rank"]
    for name, events in logs:
        # Per group (2K P2p events when the library reports every operation): each P2p's
        # function, channel count, KernelCh count and their channel ids' range.
        groups, at = [], 0
        for k in ks:
            group, at = events[at : at + 2 * k], at + 2 * k
            span = lambda ids: f" ch={ids[0]}-{ids[-1]}" if ids else ""
            groups.append({"k": k, "p2p": [f"{f} nch={n} kernel_ch={len(ids)}{span(ids)}" for f, _, n, ids in group]})
        print(json.dumps({"lib": lib, "log": name, "p2p_events": len(events), "groups": groups}), flush=True)
        if os.environ.get("CHECK") == "1":
            errors += [f"{name}: {e}" for e in check(events, ks)]
    for e in errors:
        print("WRONG", e, flush=True)
    verdict = "not checked" if os.environ.get("CHECK") != "1" else "ok" if not errors else f"{len(errors)} wrong"
    print(f"{lib}: {len(logs)} logs with P2p events, {verdict}", flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
