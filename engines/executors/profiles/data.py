"""Where the GPU operator tables are read from: the packaged derived tables, or raw files.

By default each Vidur operator file is read from `tables/<file>.gz` beside this module:
a table derived from the third-party file (TP-1 rows, the columns op_table reads; see
tables/README.md and derive_tables.py), shipped with the package. The ASCENDRA_PROFILES
environment variable overrides that with a folder of the raw files in the layout of the
raw profiles folder (`<folder>/vidur/<file>`, `<folder>/README.md`); nothing here reads
a raw file unless that variable names one.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "ASCENDRA_PROFILES"
TABLES_DIR = Path(__file__).resolve().with_name("tables")


def raw_profiles_dir() -> Path | None:
    """The raw data folder ASCENDRA_PROFILES names, or None when it is unset (packaged
    tables); FileNotFoundError naming the path and the variable if it has no `vidur/`."""
    env = os.environ.get(ENV_VAR)
    if not env:
        return None
    path = Path(env).expanduser()
    if not (path / "vidur").is_dir():
        raise FileNotFoundError(
            f"GPU profile data not found: {path / 'vidur'} does not exist. Point the "
            f"{ENV_VAR} environment variable at a folder of the raw profiles (a `vidur/` "
            f"folder of Vidur's CSV files), or unset it to use the packaged tables in {TABLES_DIR}.")
    return path


def op_file(filename: str) -> Path:
    """The operator table for Vidur's `filename` (e.g. 'a100_Llama-2-7b-hf_mlp.csv'): the
    raw file under $ASCENDRA_PROFILES/vidur, else the packaged `tables/<filename>.gz`."""
    raw = raw_profiles_dir()
    path = raw / "vidur" / filename if raw else TABLES_DIR / f"{filename}.gz"
    if not path.is_file():
        where = (f"the folder {ENV_VAR} names" if raw else
                 f"the packaged tables (reinstall, or set {ENV_VAR} to a raw profiles folder)")
        raise FileNotFoundError(f"GPU profile data file missing: {path} ({where})")
    return path
