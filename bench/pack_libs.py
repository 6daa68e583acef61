"""Pack the built libraries of a kernel database's best programs into one tar.xz.

A GPU machine starts bare, so libraries built in one call are gone in the next. This
packs, from the build cache ($L2GEN_CACHE_DIR), the entries every best program of DB
needs (a bundle member's entry and the bundle it links to), so a later call can unpack
them into its cache instead of compiling again (bench/device.sh does, from
.device-in/libs.tar.xz).

    python3 bench/pack_libs.py DB OUT.tar.xz

(``l2gen build --db DB --pack OUT.tar.xz`` does the same, building what is missing.)
"""

from __future__ import annotations

import sys
from pathlib import Path

from l2gen.build import cache_entry, pack
from l2gen.db import KernelDB
from l2gen.runner import source
from l2gen.targets import get_gpu


def main(db_path: str, out: str) -> int:
    db = KernelDB(db_path, readonly=True)
    gpu = get_gpu(db.gpu or "h200")  # the GPU the database was recorded on
    libraries, missing = [], 0
    for program, _speedup, _time_us in db.best_all(gpu).values():
        entry = cache_entry(source(program, gpu))
        if entry is None:
            missing += 1
        else:
            libraries.append(entry / "lib.so")
    count = pack(libraries, out)
    size = Path(out).stat().st_size
    print(f"packed {count} cache entries ({size / 2**20:.1f} MiB) into {out}; {missing} program(s) had no built library")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
