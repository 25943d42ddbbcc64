#!/usr/bin/env python3
"""Instructions spent in occl-telemetry, from callgrind output files (bench/telemetry-callgrind.sh).

Sums the inclusive Ir of every call from a function outside the crate into one inside it (the
fan-out's start/state/stop, the clock, the flight recorder...), so nested calls count once.
Prints "total N background M": M is what the OTLP export thread's loop and the trace file's
writing cost (not paid on the collective's path); N is the rest. With TOP=k, also the k callees
that cost most.
"""
import collections
import os
import re
import sys


def in_crate(name):
    return name.startswith(("occl_telemetry::", "<occl_telemetry::", "core::ptr::drop_in_place<occl_telemetry"))


def background(name):
    return "otlp::worker::run" in name or "write_all" in name or "trace::exporter::Inner::write" in name


def parse(path, acc):
    names = {}

    def name(s):
        # Compressed names: "(id) name" the first time, "(id)" after.
        m = re.match(r"\((\d+)\)(?: (.*))?", s)
        if not m:
            return s
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")

    fn = callee = None
    call = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                fn = name(line[3:])
            elif line.startswith("cfn="):
                callee = name(line[4:])
            elif line.startswith("calls="):
                call = True
            elif call and line and (line[0].isdigit() or line[0] in "+-*"):
                # The cost line after calls=: the call's inclusive cost, last column (Ir).
                call = False
                if fn and callee and in_crate(callee) and not in_crate(fn):
                    acc[callee] += int(line.split()[-1])


def main():
    acc = collections.Counter()
    for p in sys.argv[1:]:
        parse(p, acc)
    bg = sum(v for k, v in acc.items() if background(k))
    print("total", sum(acc.values()) - bg, "background", bg)
    for k, v in acc.most_common(int(os.environ.get("TOP", "0"))):
        print(f"{v:>12} {k}")


if __name__ == "__main__":
    main()
