#!/usr/bin/env python3
"""Several NCCL communicators in one process through the Fabric plugin.

NCCL 2.28 (net v11+) calls the plugin's init once per communicator; the
plugin shares one endpoint per device between those contexts and closes a
context's comms at its finalize. This check drives that: the default group
plus N_GROUPS more NCCL groups over the same ranks, collectives interleaved
across all of them with every element checked, then half of the extra groups
destroyed while the others keep working, then a new group created.

Run with torchrun (one process per GPU), with the environment of
tests/gpu/run.sh (NCCL_NET=Fabric, NCCL_NET_PLUGIN=<lib>, P2P/SHM disabled).
Prints one line per phase and "multi_comm_check: PASS" at the end; exits 1
on a wrong result or an exception.
"""
import datetime
import os
import sys

N_GROUPS = int(os.environ.get("N_GROUPS", "4"))
ELEMS = 1 << 20  # 4 MiB of float32 per collective


def main():
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group(backend="nccl", timeout=timeout, device_id=dev)
    groups = [None] + [dist.new_group(ranks=list(range(world)), backend="nccl") for _ in range(N_GROUPS)]

    def check(group, tag):
        """all_reduce of a rank- and tag-dependent vector; every element checked."""
        base = torch.arange(ELEMS, device=dev, dtype=torch.float32)
        t = base * (rank + 1) + tag
        dist.all_reduce(t, group=group)
        want = base * (world * (world + 1) / 2) + tag * world
        bad = (t != want).sum().item()
        if bad:
            raise RuntimeError("group %d tag %d: %d of %d elements wrong" % (groups.index(group), tag, bad, ELEMS))

    def say(msg):
        if rank == 0:
            print("multi_comm_check: " + msg, flush=True)

    for rnd in range(3):
        for i, g in enumerate(groups):
            check(g, rnd * 100 + i)
    say("%d communicators, 3 interleaved rounds: ok" % len(groups))

    doomed = groups[1:1 + N_GROUPS // 2]
    for g in doomed:
        dist.destroy_process_group(g)
    groups = [g for g in groups if g not in doomed]
    for rnd in range(3):
        for i, g in enumerate(groups):
            check(g, 1000 + rnd * 100 + i)
    say("destroyed %d, the other %d still work: ok" % (len(doomed), len(groups)))

    groups.append(dist.new_group(ranks=list(range(world)), backend="nccl"))
    for i, g in enumerate(groups):
        check(g, 5000 + i)
    say("a new communicator after the destroys: ok")
    torch.cuda.synchronize()
    dist.destroy_process_group()
    say("PASS")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001
        print("multi_comm_check: FAIL: %r" % (e,), flush=True)
        sys.exit(1)
