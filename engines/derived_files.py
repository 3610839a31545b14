"""Writing the small derived tables the package ships (profiles, traces) from raw
third-party files: byte-reproducible gzip, and the one command-line shape every
derivation script shares (`python -m ... [RAW_DIR] [--out DIR]`)."""
from __future__ import annotations

import argparse
import gzip
from collections.abc import Callable, Iterable
from pathlib import Path


def write_gzip(path: Path, data: bytes) -> None:
    """gzip with no file name and time 0 in the header, so the bytes depend on the data only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                mtime=0, compresslevel=9) as f:
        f.write(data)


def derive_all(pairs: Iterable[tuple[Path, Path]], derived: Callable[[Path], bytes],
               what: str) -> list[Path]:
    """Writes `derived(raw)` to `out` for every (raw, out) pair; returns the outputs."""
    written = []
    for raw, out in pairs:
        if not raw.is_file():
            raise FileNotFoundError(f"raw {what} missing: {raw}")
        write_gzip(out, derived(raw))
        written.append(out)
    return written


def derivation_main(argv: list[str] | None, description: str, raw_default: Path,
                    out_default: Path, derive: Callable[[Path, Path], list[Path]]) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("raw_dir", nargs="?", type=Path, default=raw_default,
                        help=f"the folder of raw files (default {raw_default})")
    parser.add_argument("--out", type=Path, default=out_default,
                        help=f"where to write the tables (default {out_default})")
    args = parser.parse_args(argv)
    for path in derive(args.raw_dir, args.out):
        print(f"{path}  {path.stat().st_size:,} bytes")
