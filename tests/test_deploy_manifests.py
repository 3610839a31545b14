"""The container image and the Kubernetes manifests (Dockerfile, deploy/): valid against
their schemas, and wired to what the daemon really serves.

Kubernetes' own kinds are checked by kubernetes-validate (strict: no unknown field); the
InferencePool and HTTPRoute by JSON Schemas derived from the upstream CRDs
(deploy/derive_schemas.py); the endpoint picker's config against the plugin types its
source registers. Then: the daemon's command lines parse (`serve --print-config`), the
probes and the pool point at routes and ports the daemon has, and the picker reads the
metric names /metrics exposes.

Covers: Dockerfile, deploy/.
"""
from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from daemon import gateway_metrics
from daemon.api import PUBLIC_PATHS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCHEMAS = DEPLOY / "schemas"
#: The Kubernetes version the core kinds are checked against.
KUBERNETES = "1.33"
#: Kinds checked by a derived schema instead of kubernetes-validate.
DERIVED = {("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool.json",
           ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.json"}
DAEMON_PORT = 8000


def _documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
                 for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


DOCUMENTS = _documents()


def _find(kind: str, name: str) -> dict:
    [doc] = [d for _, d in DOCUMENTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _daemon_deployments() -> list[dict]:
    return [d for _, d in DOCUMENTS if d["kind"] == "Deployment"
            and d["spec"]["template"]["spec"]["containers"][0]["name"] == "ascendra"]


def _epp_config() -> dict:
    return yaml.safe_load(_find("ConfigMap", "ascendra-epp")["data"]["epp-config.yaml"])


def _print_config(args: list[str]) -> str:
    """What `ascendra <args> --print-config` prints; fails the test if the CLI refuses them."""
    done = subprocess.run([sys.executable, "-m", "daemon.cli", *args, "--print-config"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


# ---- schemas ---------------------------------------------------------------------------

def test_there_are_manifests_for_the_daemon_the_pool_and_its_picker():
    kinds = {d["kind"] for _, d in DOCUMENTS}
    assert {"Deployment", "InferencePool", "HTTPRoute", "ConfigMap", "Service"} <= kinds
    assert len(_daemon_deployments()) == 2  # GPU and CPU


@pytest.mark.parametrize("name, doc", DOCUMENTS, ids=[n for n, _ in DOCUMENTS])
def test_each_manifest_is_valid_against_its_schema(name, doc):
    derived = DERIVED.get((doc["apiVersion"], doc["kind"]))
    if derived is None:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    else:
        schema = json.loads((SCHEMAS / derived).read_text())
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


def test_a_misspelt_field_fails_the_derived_schema():
    pool = json.loads(json.dumps(_find("InferencePool", "ascendra")))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    schema = json.loads((SCHEMAS / "inferencepool.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, schema, cls=jsonschema.Draft202012Validator)


def test_derived_schemas_name_their_source_and_licence():
    for path in SCHEMAS.glob("*.json"):
        source = json.loads(path.read_text())["x-source"]
        assert source["licence"] == "Apache-2.0"
        assert source["repository"].startswith("https://github.com/")
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), path


def test_the_picker_config_uses_registered_plugins_and_our_metric_names():
    config, upstream = _epp_config(), json.loads((SCHEMAS / "epp-plugin-types.json").read_text())
    assert (config["apiVersion"], config["kind"]) == (upstream["apiVersion"], upstream["kind"])
    declared = {p.get("name", p["type"]): p for p in config["plugins"]}
    assert {p["type"] for p in config["plugins"]} <= set(upstream["pluginTypes"])
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]]
    refs += [s["pluginRef"] for s in config["dataLayer"]["sources"]]
    refs += [e["pluginRef"] for s in config["dataLayer"]["sources"] for e in s["extractors"]]
    assert set(refs) <= set(declared)
    [engine] = declared["core-metrics-extractor"]["parameters"]["engineConfigs"]
    assert engine == {"name": "ascendra", "queuedRequestsSpec": gateway_metrics.WAITING,
                      "runningRequestsSpec": gateway_metrics.RUNNING,
                      "kvUsageSpec": gateway_metrics.KV_USAGE, "loraSpec": "",
                      "cacheInfoSpec": gateway_metrics.CACHE_CONFIG}
    assert declared["core-metrics-extractor"]["parameters"]["defaultEngine"] == "ascendra"
    assert declared["metrics-data-source"]["parameters"]["path"] == "/metrics"


# ---- wiring ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("deployment", _daemon_deployments(),
                         ids=[d["metadata"]["name"] for d in _daemon_deployments()])
def test_the_daemon_pods_args_parse_and_their_probes_and_ports_match(deployment):
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    printed = _print_config(container["args"])
    assert 'host = "0.0.0.0"' in printed and f"port = {DAEMON_PORT}" in printed
    [port] = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", DAEMON_PORT)
    for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"),
                        ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        assert path in PUBLIC_PATHS  # answered without the API key
    drain = float(re.search(r"^drain_timeout = ([\d.]+)$", printed, re.M).group(1))
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain
    labels = pod["metadata"]["labels"]
    pool = _find("InferencePool", "ascendra")["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert labels["llm-d.ai/engine-type"] == "ascendra"


def test_the_pool_targets_the_daemon_port_and_its_picker_service():
    pool = _find("InferencePool", "ascendra")["spec"]
    assert pool["targetPorts"] == [{"number": DAEMON_PORT}]
    service = _find("Service", pool["endpointPickerRef"]["name"])
    assert pool["endpointPickerRef"]["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    epp = _find("Deployment", "ascendra-epp")["spec"]["template"]
    assert service["spec"]["selector"].items() <= epp["metadata"]["labels"].items()
    args = epp["spec"]["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == "ascendra"
    config_file = args[args.index("--config-file") + 1]
    [mount] = epp["spec"]["containers"][0]["volumeMounts"]
    [volume] = epp["spec"]["volumes"]
    assert volume["configMap"]["name"] == "ascendra-epp" and mount["name"] == volume["name"]
    assert config_file == f"{mount['mountPath']}/epp-config.yaml"
    route = _find("HTTPRoute", "ascendra")["spec"]["rules"][0]["backendRefs"][0]
    assert (route["kind"], route["name"], route["port"]) == ("InferencePool", "ascendra",
                                                              DAEMON_PORT)


# ---- the container image -----------------------------------------------------------------

def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of the Dockerfile, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def _ignored(path: str) -> bool:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p)
               for p in patterns)


def test_what_the_dockerfile_copies_exists_and_is_in_the_build_context():
    copies = [rest.split()[:-1] for kind, rest in _instructions() if kind == "COPY"]
    sources = [s for sources in copies for s in sources]
    assert "setup.cfg" in sources and "daemon/" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source.rstrip("/")), source
    packages = re.search(r"include =\n((?:    .+\n)+)", (ROOT / "setup.cfg").read_text())
    for package in {line.strip().split(".")[0] for line in packages.group(1).splitlines()}:
        assert f"{package}/" in sources, f"setup.cfg packages {package}, the image lacks it"


@pytest.mark.slow
def test_the_images_command_is_one_the_cli_accepts_on_the_model_it_builds():
    instructions = _instructions()
    [entrypoint] = [json.loads(rest) for kind, rest in instructions if kind == "ENTRYPOINT"]
    [command] = [json.loads(rest) for kind, rest in instructions if kind == "CMD"]
    assert entrypoint == ["ascendra"]
    printed = _print_config(command)
    assert 'host = "0.0.0.0"' in printed and f"port = {DAEMON_PORT}" in printed
    model = command[command.index("--model") + 1]
    assert any(f"ascendra make-tiny-model {model}" in rest
               for kind, rest in instructions if kind == "RUN")
    [expose] = [rest for kind, rest in instructions if kind == "EXPOSE"]
    assert int(expose) == DAEMON_PORT
    cpu = _find("Deployment", "ascendra-cpu")["spec"]["template"]["spec"]["containers"][0]
    assert cpu["args"][cpu["args"].index("--model") + 1] == model
