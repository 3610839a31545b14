"""Derive the schemas tests/test_deploy_manifests.py checks deploy/*.yaml against, from
the upstream projects' own sources (all Apache-2.0).

* deploy/schemas/inferencepool.json and httproute.json: the `openAPIV3Schema` of one
  version of a CustomResourceDefinition (the Gateway API Inference Extension's
  InferencePool, the Gateway API's HTTPRoute) as a JSON Schema: descriptions dropped,
  `additionalProperties: false` on every object whose CRD prunes unknown fields (so a
  misspelt field fails, as `kubectl apply --validate=strict` would), `apiVersion` and
  `kind` pinned. CEL rules (`x-kubernetes-validations`) are kept but not checked.
* deploy/schemas/epp-plugin-types.json: the plugin types the endpoint picker registers
  (llm-d's router: every `Register(pkg.Const, ...)` of its `cmd/` and `pkg/`, the
  constant looked up in the package it names), with its default `EndpointPickerConfig`
  apiVersion.

Each file names its source repository, commit, path and licence. Rerun after fetching
newer upstream sources (a bare mirror or a checkout works):

    python deploy/derive_schemas.py --inference-extension DIR --gateway-api DIR --router DIR
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent / "schemas"
LICENCE = "Apache-2.0"
#: (output file, repository, CRD path in it, version) of each derived resource schema.
CRDS = (
    ("inferencepool.json", "kubernetes-sigs/gateway-api-inference-extension",
     "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml", "v1"),
    ("httproute.json", "kubernetes-sigs/gateway-api",
     "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml", "v1"),
)
ROUTER = "llm-d/llm-d-inference-scheduler"
ROUTER_MODULE = "github.com/llm-d/llm-d-router/"
_REGISTER = re.compile(r"\bRegister\w*\(\s*(\w+)\.(\w+)\s*,")
_CONST = re.compile(r"^\s*(?:const\s+)?(\w+)\s*(?:string\s*)?=\s*\"([a-z0-9][a-z0-9-]*)\"", re.M)
_IMPORT = re.compile(r"^\s*(?:(\w+)\s+)?\"([^\"]+)\"\s*$", re.M)


class Repo:
    """Files of one commit of a git repository (bare mirror or checkout)."""

    def __init__(self, git_dir: str, name: str, commit: str = "HEAD") -> None:
        self.git_dir, self.name = git_dir, name
        self.commit = self._git("rev-parse", commit).strip()

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", self._dot_git(), *args], check=True,
                              capture_output=True, text=True).stdout

    def _dot_git(self) -> str:
        checkout = Path(self.git_dir) / ".git"
        return str(checkout) if checkout.exists() else self.git_dir

    def read(self, path: str) -> str:
        return self._git("show", f"{self.commit}:{path}")

    def files(self, under: str, suffix: str) -> list[str]:
        names = self._git("ls-tree", "-r", "--name-only", self.commit, under).split()
        return [n for n in names if n.endswith(suffix)]

    def source(self, path: str) -> dict:
        return {"repository": f"https://github.com/{self.name}", "commit": self.commit,
                "path": path, "licence": LICENCE}


# ---- CRDs ------------------------------------------------------------------------------------

def crd_schema(repo: Repo, path: str, version: str) -> dict:
    crd = yaml.safe_load(repo.read(path))
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schema["properties"]["apiVersion"] = {"const": f"{group}/{version}"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({"apiVersion", "kind", "metadata", "spec",
                                 *schema.get("required", [])})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"{kind} {group}/{version}",
            "$comment": "Derived by deploy/derive_schemas.py: descriptions dropped, unknown "
                        "fields refused where the CRD prunes them; CEL rules not checked.",
            "x-source": repo.source(path), **schema}


def _strict(node):
    """The schema without descriptions, unknown fields refused where the CRD prunes them."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items() if key != "description"}
    if (out.get("type") == "object" and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


# ---- the endpoint picker's plugin types ---------------------------------------------------

def plugin_types(repo: Repo) -> dict:
    registered, consts = set(), _constants_by_dir(repo)
    for path in repo.files("cmd", ".go") + repo.files("pkg", ".go"):
        if path.endswith("_test.go"):
            continue
        text = repo.read(path)
        imports = _imports(text)
        for alias, name in _REGISTER.findall(text):
            value = consts.get(imports.get(alias, ""), {}).get(name)
            if value is not None:
                registered.add(value)
    defaults = "pkg/epp/config/loader/defaults.go"
    [api_version] = re.findall(r'APIVersion:\s*"([^"]+)"', repo.read(defaults))
    return {"$comment": "Plugin types the endpoint picker registers, derived by "
                        "deploy/derive_schemas.py from every Register call of cmd/ and pkg/.",
            "x-source": repo.source("cmd/, pkg/"), "apiVersion": api_version,
            "kind": "EndpointPickerConfig", "pluginTypes": sorted(registered)}


def _constants_by_dir(repo: Repo) -> dict[str, dict[str, str]]:
    """{package directory: {constant name: string value}} of the repository's Go code."""
    found: dict[str, dict[str, str]] = {}
    for path in repo.files("pkg", ".go") + repo.files("cmd", ".go"):
        if not path.endswith("_test.go"):
            directory = path.rsplit("/", 1)[0]
            found.setdefault(directory, {}).update(_CONST.findall(repo.read(path)))
    return found


def _imports(text: str) -> dict[str, str]:
    """{alias: package directory in this repository} of one Go file's imports."""
    block = re.search(r"^import \((.*?)^\)", text, re.M | re.S)
    out = {}
    for alias, path in _IMPORT.findall(block.group(1) if block else ""):
        if path.startswith(ROUTER_MODULE):
            directory = path.removeprefix(ROUTER_MODULE)
            out[alias or directory.rsplit("/", 1)[-1]] = directory
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inference-extension", required=True, help="its git directory")
    parser.add_argument("--gateway-api", required=True, help="its git directory")
    parser.add_argument("--router", required=True, help="llm-d's router: its git directory")
    args = parser.parse_args()
    dirs = {CRDS[0][1]: args.inference_extension, CRDS[1][1]: args.gateway_api}
    OUT.mkdir(exist_ok=True)
    for filename, name, path, version in CRDS:
        _write(filename, crd_schema(Repo(dirs[name], name), path, version))
    _write("epp-plugin-types.json", plugin_types(Repo(args.router, ROUTER)))


def _write(filename: str, data: dict) -> None:
    (OUT / filename).write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {OUT / filename}")


if __name__ == "__main__":
    main()
