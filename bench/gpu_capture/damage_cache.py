"""Damage the files of a warmed compile cache in one of the ways a real cache gets damaged, and say what was done.

Usage: python damage_cache.py MODE ROOT [SUFFIX_OR_DIR ...]
  MODE half:    truncate each matching file to half its size (a copy or a write cut short)
       garbage: overwrite each matching file with random bytes of the same size (a corrupted disk block)
       prefix:  truncate each matching file to a random prefix, 0 <= prefix < size (a kill mid-write; seed 26)
  A selector ending in a path separator matches every file below that folder (relative to ROOT); any other
  selector matches by file-name suffix (".so", ".cubin"); none matches every file.
Prints one line per damaged file (relative path, size before and after), then a count; exits 1 if none matched, so
the capture records that this layout has no such file instead of capturing an undamaged run under a damaged name.
"""

import os
import random
import sys
from pathlib import Path


def selected(rel: str, selectors: list[str]) -> bool:
    if not selectors:
        return True
    return any(rel.startswith(s) if s.endswith("/") else rel.endswith(s) for s in selectors)


def main() -> int:
    mode, root, selectors = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    rng = random.Random(26)
    count = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if not selected(rel, selectors):
            continue
        size = path.stat().st_size
        if mode == "half":
            new = size // 2
            os.truncate(path, new)
        elif mode == "prefix":
            new = rng.randrange(size) if size else 0
            os.truncate(path, new)
        elif mode == "garbage":
            new = size
            path.write_bytes(rng.randbytes(size))
        else:
            raise SystemExit(f"unknown mode {mode}")
        print(f"{mode} {rel} {size} -> {new}")
        count += 1
    print(f"{mode}: {count} files damaged under {root} (selectors: {' '.join(selectors) or 'all'})")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
