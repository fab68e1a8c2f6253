"""Two useful_tokens.json of one command, before and after a change of the benchmark's code: the keys each has that
the other lacks, and the leaves whose values differ, by key name (timings differ from run to run; under
deterministic kernels losses, gradients, parity and counts must not).

``python compare_runs.py BEFORE.json AFTER.json`` prints a summary; exit 1 where the keys differ or a leaf of
:data:`MUST_EQUAL` does."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter

#: Keys under which every leaf must be equal between two runs of one command under deterministic kernels.
MUST_EQUAL = ("losses", "grad_norms", "parity")


def leaves(value, path=()):
    """Every leaf of a JSON value as ``(path, value)``; a list's items by index."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, f"[{index}]"))
    else:
        yield path, value


def same(a, b) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def main(before_path: str, after_path: str) -> int:
    """Print the comparison; 1 where keys differ or a :data:`MUST_EQUAL` leaf does."""
    before = dict(leaves(json.load(open(before_path))))
    after = dict(leaves(json.load(open(after_path))))
    only_before = sorted(set(before) - set(after))
    only_after = sorted(set(after) - set(before))
    common = set(before) & set(after)
    differ = Counter(path[-1] for path in common if not same(before[path], after[path]))
    equal = sum(1 for path in common if same(before[path], after[path]))
    print(f"leaves: {len(before)} before, {len(after)} after; {equal} equal, {sum(differ.values())} differ")
    for name, paths in (("only before", only_before), ("only after", only_after)):
        for path in paths[:40]:
            print(f"{name}: {'/'.join(path)}")
    for key, count in sorted(differ.items()):
        print(f"differs: {key} x{count}")
    strict = [path for path in common if any(key in path for key in MUST_EQUAL)]
    unequal = [path for path in strict if not same(before[path], after[path])]
    print(f"{', '.join(MUST_EQUAL)}: {len(strict)} leaves, {len(unequal)} differ")
    for path in unequal[:40]:
        print(f"must be equal: {'/'.join(path)}")
    return 1 if only_before or only_after or unequal else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
