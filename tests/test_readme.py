"""The README's set-up promise: CI runs exactly the test command the README gives.

Covers: README.md, .ci/run.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shell_blocks(markdown: str) -> list[str]:
    parts = markdown.split("```sh\n")[1:]
    return [p.split("```", 1)[0].strip() for p in parts]


def test_ci_runs_the_readme_test_command():
    blocks = shell_blocks((ROOT / "README.md").read_text())
    test_commands = [b for b in blocks if "pytest" in b]
    assert len(test_commands) == 1, "the README gives one test command"
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_commands[0] in ci_lines


def test_readme_main_job_serves_the_builtin_model():
    blocks = shell_blocks((ROOT / "README.md").read_text())
    assert any(b.startswith("python3 -m venv") and b.endswith("&& ascendra serve") for b in blocks)


def test_pytest_says_why_tests_were_skipped():
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "-rs" in cfg["tool:pytest"]["addopts"].split()


def test_readme_links_resolve_and_point_inside_the_repository():
    import re
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme  # a clone has no ../shared
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_readme_config_example_loads(tmp_path):
    from daemon.config import load_config
    readme = (ROOT / "README.md").read_text()
    example = tmp_path / "ascendra.toml"
    example.write_text(readme.split("```toml\n")[1].split("```", 1)[0])
    assert load_config(str(example)).instances.layout == "2L1H"


def test_readme_says_the_tiny_model_is_gibberish_and_names_the_extras():
    readme = (ROOT / "README.md").read_text()
    assert "random weights" in readme and "gibberish" in readme
    assert "download.pytorch.org/whl/cpu" in readme
    for extra in ("`bench`", "`test`", "`gpu`"):
        assert extra in readme
