"""ServeConfig as a commented TOML file: every field's description (daemon/config.py, the
one source) above its value, grouped in sections.

`ascendra serve --print-config` prints it for the config it was given; with no other flag
that is systemd/ascendra.toml (tests/test_serve_cli.py keeps the two equal).
"""
from __future__ import annotations

import textwrap

from daemon.config import ServeConfig, documented_sections, toml_value

WIDTH = 92
HEADER = """\
# Example config for `ascendra serve --config /etc/ascendra/ascendra.toml` (the systemd unit's).
#
# Written by `ascendra serve --print-config` from the field descriptions in daemon/config.py
# (edit those, not this file); the values shown are the defaults (a field left out keeps its
# default). Every field can also be given as a flag, which wins over this file:
# `max_num_seqs` is `--max-num-seqs 128`, `drop_expired` is `--drop-expired` (flags name the
# field only, not its section). A bad value stops the daemon at start with exit code 2 and a
# message naming the section and the field.
"""


def render_toml(config: ServeConfig | None = None) -> str:
    """`config` (default: the defaults) as TOML, each section under its struct's docstring
    and each field under its description."""
    config = config or ServeConfig()
    parts = [HEADER]
    for section, about, fields in documented_sections():
        parts.append("\n" + _comment(about) + f"[{section}]\n")
        for field in fields:
            parts.append(_comment(field.description))
            value = getattr(getattr(config, section), field.name)
            if value is None:
                parts.append(f"# {field.name} = {toml_value(field.example)}\n")
            else:
                parts.append(f"{field.name} = {toml_value(value)}\n")
    return "".join(parts)


def _comment(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False) + "\n"
