#!/usr/bin/env python3
"""Instructions per call, broken down by inlined function (callgrind + addr2line).

Usage: cg_inline.py PROFILE BINARY DIVISOR ROOT [ROOT...] [--depth N] [--min X]

PROFILE is a callgrind file recorded with --dump-instr=yes. For each ROOT function (a
symbol name, e.g. copyrpc_bench::client_poll), every instruction's self cost, and the
inclusive cost of every call it makes, is charged to the instruction's chain of inlined
frames (addr2line -i), so a function inlined into ROOT gets its own line in the tree and
an out-of-line callee is charged to the inlined frame that called it. Costs are divided by
DIVISOR (the number of RPCs) and printed as a tree, frames at most N deep below ROOT
(default 4), hiding entries below X (default 1.0). A frame's figure includes its children;
what its children do not account for is its own code.
"""
import re
import subprocess
import sys
from collections import defaultdict


POS = re.compile(r'^(0x[0-9a-fA-F]+|[+-]\d+|\*)\s')


def position_cost(line, addr):
    """(instruction address, cost) of a cost line of a --dump-instr=yes profile (positions
    "instr line": absolute, relative to `addr`, the previous line's address, or `*` for the
    same), or None for another kind of line."""
    m = POS.match(line)
    if not m:
        return None
    tok = m.group(1)
    if tok.startswith('0x'):
        addr = int(tok, 16)
    elif tok != '*':
        addr += int(tok)
    parts = line.split()
    return addr, (int(parts[2]) if len(parts) > 2 else 0)


def parse(path, roots):
    """{root: {addr: cost}} from the fn blocks of `roots` (self lines and call lines)."""
    names = {}
    out = {r: defaultdict(int) for r in roots}
    cur = None
    addr = 0

    def name_of(kind, m):
        i, n = m.group(1), m.group(2)
        if n:
            names[(kind, i)] = n.strip()
        return names.get((kind, i))

    with open(path) as f:
        for line in f:
            if line.startswith('fn='):
                m = re.match(r'fn=\((\d+)\)(.*)', line)
                n = name_of('fn', m)
                cur = out.get(n)
                continue
            if line.startswith('cfn='):
                m = re.match(r'cfn=\((\d+)\)(.*)', line)
                name_of('fn', m)
                continue
            if line.startswith('calls='):
                # The next position line is the call's inclusive cost, charged to the
                # calling instruction like a self cost.
                continue
            pc = position_cost(line, addr)
            if pc is None:
                continue
            addr, cost = pc
            if cur is not None:
                cur[addr] += cost
    return out


def chains(binary, addrs):
    """addr -> [outermost .. innermost] inlined function names."""
    addrs = sorted(addrs)
    # -a prints each address before its chain of (function, file:line) pairs, innermost
    # frame first.
    p = subprocess.run(['addr2line', '-a', '-i', '-f', '-C', '-e', binary] + [hex(a) for a in addrs],
                       capture_output=True, text=True, check=True)
    res = {}
    cur = None
    frames = []
    lines = p.stdout.split('\n')
    i = 0
    while i < len(lines):
        l = lines[i]
        if l.startswith('0x'):
            if cur is not None:
                res[cur] = list(reversed(frames))
            cur = int(l, 16)
            frames = []
            i += 1
            continue
        if l:
            frames.append(short(l))
            i += 2  # skip file:line
            continue
        i += 1
    if cur is not None:
        res[cur] = list(reversed(frames))
    return res


def short(name):
    """`module::Type::method` without generic arguments or impl headers, last two parts."""
    out, depth = [], 0
    for ch in name.replace('{{closure}}', 'closure'):
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif depth == 0:
            out.append(ch)
    parts = [p for p in ''.join(out).split('::') if p]
    return '::'.join(parts[-2:])


def main():
    args = sys.argv[1:]
    depth, mincost = 4, 1.0
    if '--depth' in args:
        i = args.index('--depth')
        depth = int(args[i + 1])
        del args[i:i + 2]
    if '--min' in args:
        i = args.index('--min')
        mincost = float(args[i + 1])
        del args[i:i + 2]
    profile, binary, div, roots = args[0], args[1], float(args[2]), args[3:]
    per_root = parse(profile, roots)
    allc = set()
    for r in per_root.values():
        allc.update(r)
    ch = chains(binary, allc)
    for root in roots:
        tree = {}
        total = 0
        for a, c in per_root[root].items():
            total += c
            fr = ch.get(a, ['?'])
            # Frames below the root (the root itself is the outermost frame).
            fr = fr[1:] if fr and fr[0].endswith(root.split('::')[-1]) else fr
            # The root's own code (frame set-up, spills, its inlined glue).
            fr = fr or ['(own code)']
            node = tree
            for f in fr[:depth]:
                node = node.setdefault(f, [0, {}])
                node[0] += c
                node = node[1]
        print(f'{root}: {total / div:.1f} per RPC')

        def show(node, indent):
            for k, (c, sub) in sorted(node.items(), key=lambda kv: -kv[1][0]):
                if c / div < mincost:
                    continue
                print(f'{"  " * indent}{c / div:7.1f}  {k}')
                show(sub, indent + 1)
        show(tree, 1)


if __name__ == '__main__':
    main()
