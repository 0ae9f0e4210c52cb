#!/usr/bin/env python3
"""torch_check: the nccl_check sweep through torch.distributed (NCCL backend).

Run: torchrun --standalone --nproc_per_node=2 torch_check.py [--quick | --sizes 8,64K,...]
                 [--provider L --net L --lib L] [--warmup N] [--iters N] [--op-timeout S]

For every (size, op) of all_reduce, all_gather (all_gather_into_tensor),
reduce_scatter (reduce_scatter_tensor), broadcast (root 0) and all_to_all
(all_to_all_single): fill inputs with val(rank, i) (small integers, exact in
float32; the same function as nccl_check.c), clear the output to NaN, run the op
once and compare every element, run warm-ups and timed iterations (CUDA
events), compare every element again. Rank 0 prints one CSV line per (op, size):

  program,provider,net,version_lib,op,bytes,time_us,algbw_GBs,busbw_GBs,correct

time_us is the largest per-rank mean; bytes and busbw follow nccl-tests.
correct is PASS, FAIL, ERROR, TIMEOUT or NOTRUN. Results of the ranks are
combined over a separate gloo group, so that a broken NCCL path cannot hide a
failure. Exit status 0 only if every line is PASS.
"""
import argparse
import datetime
import os
import sys
import time
import traceback

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
DEFAULT_SIZES = "8,64,256,1K,4K,16K,64K,256K,1M,4M,16M,64M,128M,256M"
QUICK_SIZES = "8,64K,4M,64M"
STATUS = ["PASS", "FAIL", "ERROR", "TIMEOUT", "NOTRUN"]
PASS, FAIL, ERROR, TIMEOUT, NOTRUN = range(5)


def parse_size(text):
    t = text.strip()
    units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
             "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
    num = t.rstrip("bBkKmMgGiI")
    unit = t[len(num):].upper()
    if not num or unit not in units:
        raise ValueError("bad size %r" % text)
    value = int(float(num) * units[unit])
    if value <= 0:
        raise ValueError("bad size %r" % text)
    return value


def value_mask(nranks):
    bits = 0
    while (1 << bits) < nranks:
        bits += 1
    return (1 << (24 - bits)) - 1


def pattern(i, r, mask):
    """val(r, i) before the float conversion. Works on Python ints and int64 tensors
    alike; every product stays below 2^62. Must match val() in nccl_check.c."""
    key = (i + r * 0x3C6EF35) & 0x3FFFFFFF
    h = (key * 0x9E3779B1) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h = h ^ (h >> 12)
    return h & mask


def size_count(nbytes, n):
    c = nbytes // 4
    c -= c % n
    return c if c > 0 else n


def auto_iters(nbytes):
    if nbytes <= 1 << 20:
        return 5, 20
    if nbytes <= 16 << 20:
        return 2, 10
    if nbytes <= 64 << 20:
        return 1, 5
    return 1, 3


def bus_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--quick", action="store_true", help="sizes " + QUICK_SIZES)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--warmup", type=int, default=-1)
    ap.add_argument("--iters", type=int, default=-1)
    ap.add_argument("--op-timeout", type=float, default=90.0, help="seconds for one collective (NCCL and gloo)")
    ap.add_argument("--provider", default="none")
    ap.add_argument("--net", default="default")
    ap.add_argument("--lib", default="none")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in (QUICK_SIZES if args.quick else args.sizes).split(",") if s.strip()]
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            ap.error("unknown op %r" % o)

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    pid_dir = os.environ.get("CHECK_PID_DIR")  # run.sh reaps leftovers by these
    if pid_dir:
        try:
            with open(os.path.join(pid_dir, "pid.torch_check.rank%d" % rank), "w") as f:
                f.write("%d\n" % os.getpid())
        except OSError:
            pass

    def log(msg):
        sys.stderr.write("[torch_check rank %d] %s\n" % (rank, msg))
        sys.stderr.flush()

    def out(line):
        if rank == 0:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    tests = [(size_count(b, world) * 4, op) for b in sizes for op in OPS if op in ops]
    label = "%s,%s,%s" % (args.provider, args.net, args.lib)
    printed = [0]

    def row(op, nbytes, t_us, status):
        algbw = nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 and status in (PASS, FAIL) else 0.0
        out("torch_check,%s,%s,%d,%.2f,%.4f,%.4f,%s" % (label, op, nbytes, t_us, algbw,
                                                         algbw * bus_factor(op, world), STATUS[status]))
        printed[0] += 1

    def fill_rest(first_status):
        for k in range(printed[0], len(tests)):
            nb, op = tests[k]
            row(op, nb, 0.0, first_status if k == printed[0] else NOTRUN)

    out("# plan: tests=%d nranks=%d sizes=%s provider=%s net=%s lib=%s" %
        (len(tests), world, QUICK_SIZES if args.quick else args.sizes, args.provider, args.net, args.lib))

    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001
        log("cannot import torch: %r" % (e,))
        fill_rest(ERROR)
        return 2

    nccl_ver = "?"
    try:
        nccl_ver = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001
        pass
    out("# torch_check: torch %s, CUDA %s, torch's NCCL %s, %d GPU(s) visible" %
        (torch.__version__, torch.version.cuda, nccl_ver, torch.cuda.device_count()))

    if torch.cuda.device_count() <= local_rank:
        log("LOCAL_RANK %d but only %d GPU(s)" % (local_rank, torch.cuda.device_count()))
        fill_rest(ERROR)
        return 2
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    timeout = datetime.timedelta(seconds=max(args.op_timeout, 30.0))

    t0 = time.time()
    try:
        try:
            dist.init_process_group(backend="nccl", timeout=timeout, device_id=dev)
        except TypeError:  # older torch without device_id: lazy init at the first collective
            dist.init_process_group(backend="nccl", timeout=timeout)
    except Exception as e:  # noqa: BLE001
        log("init_process_group failed: %r" % (e,))
        traceback.print_exc()
        out("# init FAILED: %r" % (e,))
        fill_rest(ERROR)
        return 2
    out("# init: init_process_group took %.2f s" % (time.time() - t0))

    ctrl = None
    try:
        ctrl = dist.new_group(backend="gloo", timeout=timeout)
    except Exception as e:  # noqa: BLE001
        log("gloo control group unavailable (%r); combining results over NCCL" % (e,))

    def combine(values):
        """Element-wise max over ranks."""
        if ctrl is not None:
            t = torch.tensor(values, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
        else:
            t = torch.tensor(values, dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    mask = value_mask(world)

    def val(r, start, count):
        i = torch.arange(start, start + count, dtype=torch.int64, device=dev)
        return pattern(i, r, mask).to(torch.float32)

    maxcount = max(nb // 4 for nb, _ in tests)
    send = val(rank, 0, maxcount)
    recv = torch.empty(maxcount, dtype=torch.float32, device=dev)

    def expected(op, count):
        n = world
        if op == "all_reduce":
            e = val(0, 0, count)
            for q in range(1, n):
                e += val(q, 0, count)
            return e
        if op == "all_gather":
            return torch.cat([val(q, 0, count // n) for q in range(n)])
        if op == "reduce_scatter":
            rc = count // n
            e = val(0, rank * rc, rc)
            for q in range(1, n):
                e += val(q, rank * rc, rc)
            return e
        if op == "broadcast":
            return val(0, 0, count)
        if op == "all_to_all":
            c = count // n
            return torch.cat([val(p, rank * c, c) for p in range(n)])
        raise ValueError(op)

    def prepare(op, count):
        """Sets the output to NaN (all_reduce: to the input) and returns a callable
        running the op and the output tensor to check."""
        n = world
        if op == "all_reduce":
            o = recv[:count]
            o.copy_(send[:count])
            return (lambda: dist.all_reduce(o)), o
        if op == "all_gather":
            o = recv[:count]
            o.fill_(float("nan"))
            i = send[:count // n]
            return (lambda: dist.all_gather_into_tensor(o, i)), o
        if op == "reduce_scatter":
            o = recv[:count // n]
            o.fill_(float("nan"))
            i = send[:count]
            return (lambda: dist.reduce_scatter_tensor(o, i)), o
        if op == "broadcast":
            # The root broadcasts its (unchanged) input; the others receive into the NaN-filled output.
            if rank == 0:
                o = send[:count]
            else:
                o = recv[:count]
                o.fill_(float("nan"))
            return (lambda: dist.broadcast(o, src=0)), o
        if op == "all_to_all":
            o = recv[:count]
            o.fill_(float("nan"))
            i = send[:count]
            return (lambda: dist.all_to_all_single(o, i)), o
        raise ValueError(op)

    def mismatches(o, e, op, nbytes, when):
        bad = int((o != e).sum().item())
        if bad:
            idx = (o != e).nonzero()[:5].flatten().tolist()
            for j in idx:
                log("MISMATCH %s bytes=%d (%s) element %d: got %r expected %r" %
                    (op, nbytes, when, j, float(o[j].item()), float(e[j].item())))
            log("%s bytes=%d (%s): %d of %d elements wrong" % (op, nbytes, when, bad, o.numel()))
        return bad

    worst = PASS
    for k, (nbytes, op) in enumerate(tests):
        count = nbytes // 4
        warm, iters = auto_iters(nbytes)
        if args.warmup >= 0:
            warm = args.warmup
        if args.iters > 0:
            iters = args.iters
        if args.verbose:
            log("start %s bytes=%d warm=%d iters=%d" % (op, nbytes, warm, iters))
        status, bad, t_us = PASS, 0, 0.0
        try:
            e = expected(op, count)
            run, o = prepare(op, count)
            run()
            torch.cuda.synchronize()
            bad += mismatches(o, e, op, nbytes, "first run")
            for _ in range(warm):
                run()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                run()
            stop.record()
            stop.synchronize()
            t_us = start.elapsed_time(stop) * 1000.0 / iters
            if op == "all_reduce":  # in place: the timed iterations changed the data; run once more from fresh input
                run, o = prepare(op, count)
                run()
                torch.cuda.synchronize()
            bad += mismatches(o, e, op, nbytes, "after timed iterations")
            if bad:
                status = FAIL
            del e
        except Exception as ex:  # noqa: BLE001
            log("%s bytes=%d raised %r" % (op, nbytes, ex))
            traceback.print_exc()
            status = ERROR
        if status == ERROR:
            # The communicator is unusable; don't wait for the other ranks through it.
            if rank == 0:
                fill_rest(ERROR)
            return 3
        try:
            t_max, bad_max, st_max = combine([t_us, float(bad), float(status)])
        except Exception as ex:  # noqa: BLE001
            log("combining results failed: %r" % (ex,))
            if rank == 0:
                fill_rest(ERROR)
            return 3
        st = int(st_max)
        if rank == 0:
            row(op, nbytes, t_max, st)
        worst = max(worst, st)

    try:
        tail = send[:maxcount]
        intact = bool(torch.equal(tail, val(rank, 0, maxcount)))
        if not intact:
            log("send buffer modified")
            worst = max(worst, FAIL)
        if ctrl is not None:
            dist.barrier(group=ctrl)
        dist.destroy_process_group()
    except Exception as ex:  # noqa: BLE001
        log("teardown: %r" % (ex,))
        worst = max(worst, ERROR)
    out("# rank 0 done: %s" % ("all PASS" if worst == PASS else "FAILURES"))
    return 0 if worst == PASS else 1


if __name__ == "__main__":
    sys.exit(main())
