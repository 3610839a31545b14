"""Derives the packaged operator tables (tables/*.csv.gz) from Vidur's raw `mlp.csv` files.

Per file every registered profile uses: the rows op_table reads (every tensor-parallel
degree, one per token count, the later row winning) and only the columns it reads
(op_table.COLUMNS: num_tokens, the median of emb and the 9 per-layer ops, the layer shape,
the degree), values copied verbatim; and of each all-reduce network file a profile uses,
the rows all_reduce.py reads (all_reduce.derived_csv). Gzip-compressed CSV written
byte-reproducibly (no name or time in the header).

    python -m engines.executors.profiles.derive_tables [RAW_DIR] [--out DIR]

RAW_DIR is a folder laid out as the shared `profiles` folder (default ../shared/profiles
beside the checkout); the raw files themselves never enter the repository.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from engines.derived_files import derivation_main, derive_all
from engines.executors.profiles.data import TABLES_DIR
from engines.executors.profiles import all_reduce
from engines.executors.profiles.op_table import COLUMNS, read_rows
from engines.executors.profiles.registry import PROFILES

#: Where the raw third-party files lie beside a checkout: this derivation's default input
#: (only here: nothing that runs needs them).
RAW_DEFAULT_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "profiles"


def ops_files() -> list[str]:
    """The Vidur files the registered profiles read."""
    return sorted({profile.ops_file for profile in PROFILES.values()})


def network_files() -> list[str]:
    """The Vidur all-reduce files the registered profiles read."""
    return sorted({p.network_file for p in PROFILES.values() if p.network_file})


def derived_csv(raw_file: Path) -> bytes:
    """The derived table of one raw Vidur file, as CSV text bytes (before compression)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([row.get(c, "1") for c in COLUMNS] for row in read_rows(raw_file, None))
    return text.getvalue().encode()


def derive(raw_dir: Path, out_dir: Path) -> list[Path]:
    """Writes `<out_dir>/<file>.gz` for every file of ops_files(); returns their paths."""
    ops = derive_all(((raw_dir / "vidur" / name, out_dir / f"{name}.gz") for name in ops_files()),
                     derived_csv, "Vidur file")
    return ops + derive_all(((raw_dir / "vidur" / name, out_dir / f"{name}.gz")
                             for name in network_files()), all_reduce.derived_csv,
                            "Vidur network file")


def main(argv: list[str] | None = None) -> None:
    derivation_main(argv, __doc__.splitlines()[0], RAW_DEFAULT_DIR, TABLES_DIR, derive)


if __name__ == "__main__":
    main()
