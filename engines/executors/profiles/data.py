"""Finding and reading the third-party GPU profiling data (../shared/profiles).

The data is not ours and never enters the repository: it is read at run time from
`<repo>/../shared/profiles`, or from the folder the ASCENDRA_PROFILES environment
variable names. Its README says where every file comes from.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "ASCENDRA_PROFILES"
_REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DIR = _REPO_ROOT.parent / "shared" / "profiles"


def profiles_dir() -> Path:
    """The profile data folder; FileNotFoundError naming the path and the variable if absent."""
    env = os.environ.get(ENV_VAR)
    path = Path(env).expanduser() if env else DEFAULT_DIR
    if not (path / "vidur").is_dir():
        raise FileNotFoundError(
            f"GPU profile data not found: {path / 'vidur'} does not exist. Point the "
            f"{ENV_VAR} environment variable at the shared 'profiles' folder "
            f"(default {DEFAULT_DIR}).")
    return path


def profile_file(relative: str) -> Path:
    """A file under the profile data folder, e.g. 'vidur/a100_Llama-2-7b-hf_mlp.csv'."""
    path = profiles_dir() / relative
    if not path.is_file():
        raise FileNotFoundError(f"GPU profile data file missing: {path} (folder set by "
                                f"{ENV_VAR}, default {DEFAULT_DIR})")
    return path
