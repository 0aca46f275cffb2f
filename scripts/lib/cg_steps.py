#!/usr/bin/env python3
"""Instructions per call, broken down by the project source file (protocol step) and
function that executes them (callgrind + addr2line).

Usage: cg_steps.py PROFILE BINARY DIVISOR REPO SIDE=ROOT[,ROOT...] [SIDE=...] [--min X]

PROFILE is a callgrind file recorded with --dump-instr=yes and --separate-callers=N (N deep
enough that each out-of-line function's block belongs to one caller chain; a block shared by
several chains is split between them in proportion to the calls' costs). ROOT is a function
name as callgrind prints it without its caller suffix (e.g. erpc_lockstep::client_poll).

Every instruction's self cost goes to the innermost inlined frame (addr2line -i) whose source
file lies in REPO, so a standard-library helper (a slice copy, a bounds check) counts for the
project function that used it; out-of-line callees are expanded, and the cost of code outside
the binary (libc's memcpy) goes to the call site. For each SIDE (the sum of its ROOTs) the
script prints instructions per call (costs divided by DIVISOR) per source file, and within
each file per function, hiding entries below X (default 1.0).
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

from cg_inline import position_cost, short  # the same parsing and frame names as the tree


def parse(path):
    """(self costs {fn: {addr: cost}}, calls {fn: [(callee, call-site addr, cost)]})."""
    names = {}
    selfc = defaultdict(lambda: defaultdict(int))
    calls = defaultdict(list)
    cur = None
    callee = None
    in_call = False
    addr = 0

    def name_of(s):
        m = re.match(r'\((\d+)\)(.*)', s)
        if not m:
            return s.strip()
        i, n = m.group(1), m.group(2).strip()
        if n:
            names[i] = n
        return names.get(i)

    with open(path) as f:
        for line in f:
            if line.startswith('fn='):
                cur = name_of(line[3:])
                continue
            if line.startswith('cfn='):
                callee = name_of(line[4:])
                continue
            if line.startswith('calls='):
                in_call = True
                continue
            pc = position_cost(line, addr)
            if pc is None:
                continue
            addr, cost = pc
            if cur is None:
                in_call = False
                continue
            if in_call:
                calls[cur].append((callee, addr, cost))
                in_call = False
            else:
                selfc[cur][addr] += cost
    return selfc, calls


def frames(binary, addrs, repo):
    """addr -> (file relative to repo, function) of its innermost frame inside repo, or None."""
    addrs = sorted(addrs)
    res = {}
    for k in range(0, len(addrs), 20000):
        chunk = addrs[k:k + 20000]
        p = subprocess.run(['addr2line', '-a', '-i', '-f', '-C', '-e', binary] +
                           [hex(a) for a in chunk], capture_output=True, text=True, check=True)
        cur = None
        lines = p.stdout.split('\n')
        i = 0
        while i < len(lines):
            l = lines[i]
            if l.startswith('0x'):
                cur = int(l, 16)
                res.setdefault(cur, None)
                i += 1
                continue
            if l and i + 1 < len(lines):
                fn, loc = l, lines[i + 1]
                file = loc.rsplit(':', 1)[0]
                if cur is not None and res[cur] is None and file.startswith(repo + '/'):
                    res[cur] = (os.path.relpath(file, repo), short(fn))
                i += 2
                continue
            i += 1
    return res


def main():
    args = sys.argv[1:]
    mincost = 1.0
    if '--min' in args:
        i = args.index('--min')
        mincost = float(args[i + 1])
        del args[i:i + 2]
    profile, binary, div, repo = args[0], args[1], float(args[2]), os.path.realpath(args[3])
    sides = []
    for s in args[4:]:
        side, roots = s.split('=', 1)
        sides.append((side, roots.split(',')))
    selfc, calls = parse(profile)
    allc = set()
    for d in selfc.values():
        allc.update(d)
    for lst in calls.values():
        allc.update(a for _, a, _ in lst)
    where = frames(binary, allc, repo)
    memo = {}

    def breakdown(fn, stack=()):
        """{(file, function) or None: cost} of fn's block, callees expanded."""
        if fn in memo:
            return memo[fn]
        out = defaultdict(float)
        if fn in stack:  # recursion beyond the caller-chain depth: keep it unexpanded
            return out
        for a, c in selfc.get(fn, {}).items():
            out[where.get(a)] += c
        for callee, a, c in calls.get(fn, []):
            sub = breakdown(callee, stack + (fn,))
            total = sum(sub.values())
            site = where.get(a)
            if total <= 0:
                out[site] += c
                continue
            for k, v in sub.items():
                # Code outside the binary (libc) counts for the call site.
                out[k if k is not None else site] += v * c / total
        memo[fn] = out
        return out

    def base(n):
        return n.split("'", 1)[0]

    for side, roots in sides:
        acc = defaultdict(float)
        for fn in set(selfc) | set(calls):
            if base(fn) in roots:
                for k, v in breakdown(fn).items():
                    acc[k] += v
        # A root's block appears once per caller chain; each was summed once above.
        total = sum(acc.values())
        print(f'{side}: {total / div:.1f} per call')
        files = defaultdict(float)
        for k, v in acc.items():
            files[k[0] if k else '(outside the repository)'] += v
        for file, v in sorted(files.items(), key=lambda kv: -kv[1]):
            if v / div < mincost:
                continue
            print(f'  {v / div:7.1f}  {file}')
            fns = [(k[1], c) for k, c in acc.items() if k and k[0] == file]
            for name, c in sorted(fns, key=lambda kv: -kv[1]):
                if c / div >= mincost:
                    print(f'    {c / div:7.1f}  {name}')


if __name__ == '__main__':
    main()
