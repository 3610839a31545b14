"""Derives the packaged reference numbers (bench/data/reference_data/profile_refs.json) from the
shared profiles README, with the parser of bench/data/profile_refs.py.

    python -m bench.data.derive_profile_refs [RAW_DIR] [--out FILE]

RAW_DIR is the raw profiles folder holding README.md (default ../shared/profiles beside
the checkout); the README itself never enters the repository.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.data.profile_refs import REFS_FILE, encode_refs, from_readme
from engines.executors.profiles.derive_tables import RAW_DEFAULT_DIR


def derived_json(raw_dir: Path) -> str:
    """The packaged file's text for the README in `raw_dir`."""
    readme = raw_dir / "README.md"
    if not readme.is_file():
        raise FileNotFoundError(f"raw profiles README missing: {readme}")
    return encode_refs(from_readme(readme.read_text()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw_dir", nargs="?", type=Path, default=RAW_DEFAULT_DIR,
                        help=f"the raw profiles folder (default {RAW_DEFAULT_DIR})")
    parser.add_argument("--out", type=Path, default=REFS_FILE,
                        help=f"the file to write (default {REFS_FILE})")
    args = parser.parse_args(argv)
    args.out.write_text(derived_json(args.raw_dir))
    print(f"{args.out}  {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
