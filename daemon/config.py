"""`ascendra serve` configuration: nested msgspec structs, set in TOML, overridden by flags.

The TOML file has one section per part (`[http]` `port = 8000`, `[scheduler]`
`chunk_size = 2048`); every field is also a flat flag (`--port 8000`, booleans as
`--drop-expired` / `--no-drop-expired`) and a flag wins. The parts are the structs of
the layers that use them, so each default is written once -- `SchedulerConfig` in
engines/, `SloConfig` and `ControllerConfig` beside the controller core -- and the
simulator uses the same ones. Validation errors name the section and the field. Each
field's description (its `Meta`) is its one text: `serve --help`, `serve --print-config`
and systemd/ascendra.toml show it.
"""
from __future__ import annotations

import argparse
import enum
import functools
import itertools
import json
import tomllib
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from daemon.core.controller_config import ControllerConfig, SloConfig, TenantsConfig
from daemon.layout import DEFAULT_LAYOUT, layout_modes, parse_layout
from daemon.model_plan import ModelPlan, instance_gpus, per_model, plan_models
from daemon.slo_defaults import (
    DEFAULT_SLO_SCALE, SLO_SCALE_HELP, latency_slo_scale, scaled_slo,
)
from engines.scheduler_config import SchedulerConfig
from engines.executors.executor_config import DEFAULT_CUDA_GRAPH_MAX_BATCH, DEFAULT_TORCH_THREADS
from engines.executors.latency import make_latency

PositiveInt = Annotated[int, Meta(ge=1)]
PositiveFloat = Annotated[float, Meta(gt=0)]
Seconds = Annotated[float, Meta(ge=0)]


def doc(description: str, *, example=None) -> Meta:
    """A field's description -- the one text `serve --help`, `--print-config` and
    systemd/ascendra.toml show; `example` is shown for a field whose default is unset."""
    return Meta(description=description, examples=None if example is None else [example])


class ServedModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The models served, and under which names."""

    model: Annotated[str | list[str], doc(
        'Hugging Face model folder (config.json, *.safetensors, tokenizer.json); "" = the '
        "built-in tiny model, made on first use in $ASCENDRA_CACHE. `serve` logs the folder: "
        "load testers take it as their tokenizer. A list serves several models, each with "
        "its own instances and tokenizer, chosen by a request's `model` (as a flag: --model "
        "repeated; daemon/model_plan.py).")] = ""
    served_model_name: Annotated[str | list[str], doc(
        'The model name clients send and /v1/models lists; "" = the model folder\'s name. '
        "With several models, one name per model in their order (--served-model-name "
        "repeated); names must differ.")] = ""
    placement: Annotated[str | list[str], doc(
        'Which instances hold which models. "dedicated": each model its own instances; '
        '"multiplexed": every instance holds every model (MuxServe: their weights on one '
        "device, one KV pool shared by their requests, each step's budget split by "
        "popularity and TBT target; engines/mux_core.py), with the first model's layout. "
        "A list, one per model: \"dedicated\" or a group name; the models of a group share "
        "its instances (--placement repeated).")] = "dedicated"
    groups: Annotated[list[str], doc(
        'Instance groups named outright, each "NAME+NAME:LAYOUT" over the served names '
        '(--groups "a+b:2xsarathi,a:1xsarathi": instances 0-1 hold a and b, instance 2 only '
        "a); a model may be in several groups, and its requests go to the least loaded "
        "group holding it. Set, it replaces placement and layout.")] = []
    max_model_len: Annotated[PositiveInt | None, doc(
        "Context limit of one request (prompt + output), for both executors; unset = the "
        "model's (config.json max_position_embeddings, capped at a sliding window; the tiny "
        "model: 2048). /v1/models reports it.", example=4096)] = None


class InstancesConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The engine instances: how many of which kind, on which executor and GPUs, and
    their KV cache."""

    layout: Annotated[str | list[str], doc(
        'How many engine instances of which kind. "" (the default) = Ascendra\'s "<n>A" with '
        "one instance per GPU listed in `gpus` (none listed: \"1A\", one instance in the LP "
        "role). Else \"<count>x<mode>\" (modes sarathi, vllm, lp, "
        'hp), e.g. "3xsarathi" (the baselines), Ascendra\'s "<n>L<m>H", e.g. "2L1H" (2 LP + 1 HP '
        'instances), "<n>A", e.g. "3A" (3 instances switching between LP and HP online), '
        'or DistServe\'s prefill/decode split "<n>P<m>D", e.g. "2P1D" (2 prefill '
        "instances hand each request with its KV cache to 1 decode instance). With several "
        "models: one layout for each of them, or a list of one per model (--layout "
        "repeated); instance ids and `gpus` run on across the models in order.")] = DEFAULT_LAYOUT
    executor: Annotated[Literal["torch", "sim"], doc(
        '"torch" runs the model; "sim" runs none and only waits out `sim_latency` per step, '
        "streaming text tokens of the model's tokenizer.")] = "torch"
    sim_latency: Annotated[str, doc(
        'Step latency of the sim executor: "zero", "constant:SECONDS" or '
        '"profile:NAME".')] = "zero"
    profile: Annotated[str, doc(
        'Shorthand for sim_latency = "profile:NAME": a100-llama3-8b, a100-mistral-7b, '
        "a100-llama2-7b, h100-llama2-7b, a100-qwen14b (GPU operator profiles packaged from "
        "Vidur's data; $ASCENDRA_PROFILES may name a folder of the raw files instead).")] = ""
    slo_scale: Annotated[str, doc(
        f"The sim executor's {SLO_SCALE_HELP}; as `simulate`/`capacity`/`plan --slo-scale` "
        "(daemon/slo_defaults.py). A 70B's profile serves at its own SLOs, as it is "
        "simulated.")] = DEFAULT_SLO_SCALE
    device: Annotated[str, doc('"cpu", "cuda" or "cuda:N"; "" = cuda when available.')] = ""
    gpus: Annotated[list[int], doc(
        "GPU ids dealt out to the instances in order, `gpus_per_instance` each (pinned with "
        'CUDA_VISIBLE_DEVICES), e.g. [0, 1, 2] for "2L1H" (as a flag: --gpus 0,1,2); [] = no '
        "pinning, every instance sees every GPU.")] = []
    gpus_per_instance: Annotated[PositiveInt, doc(
        "GPUs each instance takes from `gpus` (with tp > 1: tp, one per rank).")] = 1
    tp: Annotated[PositiveInt | list[PositiveInt], doc(
        "Tensor-parallel degree: each instance runs the model over this many ranks, one "
        "process and one GPU each (of `gpus`: with --layout 2L1H --tp 2 --gpus 0-5 instance "
        "i takes GPUs 2i and 2i+1; on CPU the ranks share the cores over gloo); the model's "
        "attention heads must divide by it. With several models: one for all, or one per "
        "model (--tp repeated).")] = 1
    block_size: Annotated[PositiveInt, doc(
        "Tokens per KV block (flash-attn's paged kernels want a multiple of 256).")] = 16
    num_kv_blocks: Annotated[PositiveInt | None, doc(
        "KV cache size in blocks per instance; unset = sized from free GPU memory (sim: "
        "4096).", example=8192)] = None
    cuda_graph_max_batch: Annotated[int, Meta(ge=0), doc(
        "torch on CUDA: decode steps of up to this many sequences (and at most the mode's "
        "max_num_seqs) replay CUDA graphs captured at start; 0 = always eager (vLLM's "
        "--enforce-eager).")] = DEFAULT_CUDA_GRAPH_MAX_BATCH
    torch_threads: Annotated[int, Meta(ge=0), doc(
        "torch: threads each instance process runs its operators on (torch.set_num_threads; "
        "a tensor-parallel rank's too); 0 = torch's default, one per core (or "
        "OMP_NUM_THREADS), and at tp > 1 on CPU the cores shared out over the ranks. On "
        "a CPU shared by several processes, 1 keeps an instance's steps from waiting at "
        "every operator for a thread the others have taken (docs/measured_profiles.md).")
    ] = DEFAULT_TORCH_THREADS
    perf_profile: Annotated[str, doc(
        "torch: a profile file `ascendra profile` wrote of this executor and model; the "
        "performance model (LP/HP modes) starts from its step times instead of timing "
        'batches at start (which takes up to 5 s an instance); "" = calibrate at start.')] = ""
    step_log: Annotated[str, doc(
        "A debugging record: a folder where each instance process writes `steps-N.jsonl`, one "
        "line per step it runs (the batch's prefill chunks and decode contexts, the "
        "executor's wall and CPU seconds, the scheduler's; engines/step_log.py), to compare "
        'a live run\'s steps with a profile\'s; "" = none (no cost).')] = ""

    def __post_init__(self) -> None:
        # Checked with the config, not later in serve() or an instance process.
        if isinstance(self.layout, str):
            if not self.layout:
                pass  # the default is made to fit the GPUs (ServeConfig.model_plans)
            elif isinstance(self.tp, int):  # else: counted against the models by ServeConfig
                parse_layout(self.layout, self.gpus or None,  # "layout: ..."
                             instance_gpus(self.tp, self.gpus_per_instance))
            else:
                layout_modes(self.layout)
        else:  # one per model: counted against the models by ServeConfig
            for layout in filter(None, self.layout):
                layout_modes(layout)
        field = "profile" if self.profile else "sim_latency"
        try:
            make_latency(self.resolved_sim_latency)
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
        if self.executor != "sim" and self.resolved_sim_latency != "zero":
            # a setting that cannot act is an error, not silence: the torch executor runs
            # the model, at the speed of this machine, whatever profile is named
            raise ValueError(f"{field}: only the sim executor waits out a step latency; with "
                             f"executor {self.executor!r} the model runs at this machine's "
                             "speed (add --executor sim, or drop the setting)")
        if self.torch_threads and self.executor != "torch":
            raise ValueError("torch_threads: only the torch executor runs operators on threads "
                             "(a sim executor runs none)")
        if self.perf_profile and self.executor != "torch":
            raise ValueError("perf_profile: only the torch executor calibrates its performance "
                             "model at start (a sim executor's model is its profile's)")
        latency_slo_scale(self.resolved_sim_latency, self.slo_scale)  # "instances.slo_scale: ..."

    @property
    def resolved_sim_latency(self) -> str:
        return f"profile:{self.profile}" if self.profile else self.sim_latency


class HttpConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The OpenAI-compatible HTTP API and the limits at its edge."""

    host: Annotated[str, doc(
        "Address the HTTP API listens on; a warning is logged when it is not loopback and no "
        "API key is set.")] = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535), doc(
        'TCP port of the HTTP API; 0 = any free port (the "serving ..." log line and '
        "port_file name it).")] = 8000
    port_file: Annotated[str, doc(
        "A file the daemon writes the HTTP port to (one line) once it listens, and removes "
        'when it stops: how a script learns the port of port = 0; "" = none.')] = ""
    api_key: Annotated[str, doc(
        'Required as "Authorization: Bearer <key>" on the /v1 routes; "" = no key. Rather '
        "than writing it here, give it as $ASCENDRA_API_KEY (e.g. an EnvironmentFile= of the "
        "unit).")] = ""
    max_body_bytes: Annotated[PositiveInt, doc(
        "Largest request body accepted, bytes (larger: 413).")] = 1 << 20
    header_timeout: Annotated[PositiveFloat, doc(
        "Seconds a client may take to send a request's headers, counted from when it "
        "connects or its previous response ends (so also how long an idle keep-alive "
        "connection stays open); slower: the connection is closed.")] = 10.0
    body_timeout: Annotated[PositiveFloat, doc(
        "Seconds a client may take to send a request's body once its headers are in; "
        "slower: 408 and the connection is closed.")] = 30.0
    max_connections: Annotated[PositiveInt, doc(
        "Most client connections open at once; one more gets 503 and is closed (keep it "
        "under the open-file limit, the unit's LimitNOFILE).")] = 1000
    default_max_tokens: Annotated[PositiveInt, doc(
        "max_tokens of a request that gives none.")] = 256
    max_tokens_limit: Annotated[PositiveInt, doc(
        "The most max_tokens a request may ask for (more: 400).")] = 4096


class ProcessConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The daemon process: shutdown, sockets, supervision, logs."""

    drain_timeout: Annotated[Seconds, doc(
        "Seconds in-flight requests may take to finish after SIGTERM (keep it under the "
        "unit's TimeoutStopSec); what is still running then ends with a 503 / SSE error "
        "event.")] = 30.0
    runtime_dir: Annotated[str, doc(
        'Folder of the ZeroMQ ipc:// sockets (mode 0700); "" = $RUNTIME_DIRECTORY '
        "(systemd's RuntimeDirectory=, /run/ascendra) or else a fresh temporary "
        "folder.")] = ""
    heartbeat_interval: Annotated[PositiveFloat, doc(
        "Seconds between an instance's stats reports (/health, /metrics).")] = 1.0
    restart_backoff_max: Annotated[PositiveFloat, doc(
        "Longest wait before restarting an instance that died (the wait doubles from "
        "1 s).")] = 30.0
    request_log: Annotated[str, doc(
        "A file to append one JSON line to per request as it ends (daemon.request_log: "
        'instances, offloaded, outcome, TTFT); "" = none.')] = ""
    log_level: Annotated[Literal["debug", "info", "warning", "error"], doc(
        '"debug", "info", "warning" or "error".')] = "info"


class ServeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything `ascendra serve` takes, one TOML section per part (the structs of the
    layers that use them: `SchedulerConfig` is the engines', `SloConfig` and
    `ControllerConfig` the controller core's)."""

    model: ServedModelConfig = ServedModelConfig()
    instances: InstancesConfig = InstancesConfig()
    http: HttpConfig = HttpConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    slo: SloConfig = SloConfig()
    controller: ControllerConfig = ControllerConfig()
    tenants: TenantsConfig = TenantsConfig()
    process: ProcessConfig = ProcessConfig()

    def __post_init__(self) -> None:
        plans = self.model_plans()  # names unique, a layout per model, enough GPUs
        if self.controller.esp_max_degree > 1 and any(len(p.names) > 1 for p in plans):
            raise ValueError("controller.esp_max_degree: ESP groups need instances of one "
                             "model (a multiplexed instance holds several: model.placement)")
        tps = self.instances.tp if isinstance(self.instances.tp, list) else [self.instances.tp]
        if (self.controller.esp_max_degree > 1 and max(tps) > 1
                and self.instances.executor == "torch"):
            raise ValueError("controller.esp_max_degree: ESP groups of torch instances need "
                             "instances.tp = 1 (a group over tensor-parallel ranks, rank r of "
                             "each member exchanging with rank r of the others, is not built; "
                             "the sim executor and the simulator run it)")
        if (self.controller.esp_max_degree > 1 and self.instances.executor == "torch"
                and self.instances.device != "cpu"):
            raise ValueError("controller.esp_max_degree: ESP groups of torch instances need "
                             "device = \"cpu\" (gloo; NCCL groups are not built)")

    def model_plans(self) -> list[ModelPlan]:
        """Each served model's name, folder, layout and instances (daemon/model_plan.py)."""
        return plan_models(self.model.model, self.model.served_model_name, self.instances.layout,
                           self.instances.gpus or None, self.instances.gpus_per_instance,
                           self.instances.tp, self.model.placement, self.model.groups)


#: The TOML sections, in order, and the struct of each.
SECTIONS: dict[str, type] = {
    "model": ServedModelConfig, "instances": InstancesConfig, "http": HttpConfig,
    "scheduler": SchedulerConfig, "slo": SloConfig, "controller": ControllerConfig,
    "tenants": TenantsConfig, "process": ProcessConfig}
#: The sections the simulator's commands (`simulate`, `capacity`, `plan`) take as flags too.
SIMULATOR_SECTIONS = ("scheduler", "slo", "controller", "tenants")
#: Fields no one sets by hand: the layout sets each instance's scheduler mode.
NOT_SETTABLE = {("scheduler", "mode")}
#: vLLM's spelling of a setting's flag, accepted beside ours (`vllm serve` bounds its
#: waiting queue with these two; a 503 answers a request past either, as here).
VLLM_FLAG_ALIASES = {"max_queued_requests": ("--max-num-queued-reqs",),
                     "max_queued_tokens": ("--max-num-queued-tokens",)}


def load_config(path: str | None = None, overrides: dict | None = None) -> ServeConfig:
    """Read TOML (if any), apply non-None overrides (flat field names, as the flags give
    them: `{"port": 9000}`), validate. Errors name the section and field."""
    data: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config {path}: {exc}") from None
        _check_sections(data, path)
    for name, value in (overrides or {}).items():
        if value is not None:
            data.setdefault(FLAT[name], {})[name] = value
    try:
        config = msgspec.convert(data, ServeConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"config: {exc}") from None
    return with_model_slo(config, given=set(data.get("slo", {})))


def with_model_slo(config: ServeConfig, given: set[str]) -> ServeConfig:
    """`config` with its default SLOs times the served model's scale (`instances.slo_scale`,
    daemon/slo_defaults.py), as the simulator holds the model to them; a target named in
    `given` (set in the file or by a flag) is kept."""
    instances = config.instances
    scale = latency_slo_scale(instances.resolved_sim_latency, instances.slo_scale)
    slo = scaled_slo(config.slo, scale, given)
    return config if slo == config.slo else msgspec.structs.replace(config, slo=slo)


def _check_sections(data: dict, path: str) -> None:
    """A field written outside its section (as the flat configs before sections had it)
    gets a message saying where it belongs."""
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            continue
        where = f"it belongs under [{FLAT[key]}]" if key in FLAT else \
            f"the sections are {', '.join(f'[{n}]' for n in SECTIONS)}"
        raise ValueError(f"config {path}: {key!r} is not a section; {where}")
    for section, name in NOT_SETTABLE:
        if name in data.get(section, {}):
            raise ValueError(f"config {path}: {section}.{name} is set by instances.layout, "
                             "not by hand")


class FieldDoc(msgspec.Struct, frozen=True):
    """What the help and the example config say about one settable field."""
    section: str
    name: str
    description: str
    default: Any
    example: Any = None


@functools.cache
def field_docs() -> tuple[FieldDoc, ...]:
    """Every settable field, section by section, with its description (its Meta)."""
    docs = []
    for section, struct in SECTIONS.items():
        hints = typing.get_type_hints(struct, include_extras=True)
        for field in msgspec.structs.fields(struct):
            if (section, field.name) in NOT_SETTABLE:
                continue
            meta = next((m for m in getattr(hints[field.name], "__metadata__", ())
                         if isinstance(m, Meta) and m.description), None)
            if meta is None:
                raise TypeError(f"{struct.__name__}.{field.name} has no description")
            default = (field.default_factory() if field.default is msgspec.NODEFAULT
                       else field.default)
            docs.append(FieldDoc(section, field.name, meta.description, default,
                                 meta.examples[0] if meta.examples else None))
    names = [d.name for d in docs]
    if len(names) != len(set(names)):
        raise TypeError(f"field names must be unique across sections (one flag each): {names}")
    return tuple(docs)


def documented_sections() -> Iterator[tuple[str, str, list[FieldDoc]]]:
    """(section, what its struct's docstring says, its settable fields) in order: what the
    example config and docs/configuration.md are written from."""
    for section, fields in itertools.groupby(field_docs(), key=lambda d: d.section):
        yield section, " ".join((SECTIONS[section].__doc__ or "").split()), list(fields)


#: Field name -> its section (flags are flat: `--port` sets [http] port).
FLAT: dict[str, str] = {d.name: d.section for d in field_docs()}


def toml_value(value: Any) -> str:
    """A config value as TOML writes it (and as the help shows defaults)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return toml_value(value.value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, its keys quoted
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def add_config_flags(parser: argparse.ArgumentParser, sections=None) -> None:
    """One flag per settable field of `sections` (default: all; `max_num_seqs` ->
    `--max-num-seqs`), default None = unset, its help the field's description and default.
    Booleans are switches (`--drop-expired` / `--no-drop-expired`); lists are
    comma-separated (`--gpus 0,1`), tables too (`--tenant-weights a=2,b=1`); a text-or-list field (one per model) is a flag given
    once or repeated (`--model A --model B`). The simulator's commands take the sections
    they share with `serve` (scheduler, slo, controller) the same way, with the same
    defaults.

    Other flags arrive as text and are converted with the same validation as TOML values.
    """
    for field in field_docs():
        if sections is not None and field.section not in sections:
            continue
        kind = typing.get_type_hints(SECTIONS[field.section])[field.name]
        flag = "--" + field.name.replace("_", "-")
        shown = "unset" if field.default is None else toml_value(field.default)
        help_text = f"{field.description} (default: {shown})".replace("%", "%%")
        if kind is bool:
            parser.add_argument(flag, dest=field.name, default=None, help=help_text,
                                action=argparse.BooleanOptionalAction)
        elif typing.get_origin(kind) is list:
            parser.add_argument(flag, dest=field.name, default=None, help=help_text,
                                metavar="A,B", type=_comma_list)
        elif typing.get_origin(kind) is dict:
            parser.add_argument(flag, dest=field.name, default=None, help=help_text,
                                metavar="K=V,...", type=_comma_dict)
        elif kind == str | list[str] or _per_model_int(kind):
            parser.add_argument(flag, dest=field.name, default=None, help=help_text,
                                metavar="TEXT", action=_Repeated)
        else:
            choices = _choices(kind)
            parser.add_argument(flag, *VLLM_FLAG_ALIASES.get(field.name, ()), dest=field.name,
                                default=None, help=help_text,
                                choices=choices, metavar=None if choices else _metavar(kind))


def _per_model_int(kind) -> bool:
    """An integer-or-list field (one per model, e.g. tp): a flag given once or repeated."""
    return typing.get_origin(kind) in (typing.Union, types.UnionType) and any(
        typing.get_origin(a) is list for a in typing.get_args(kind)) and int in {
        typing.get_args(a)[0] if typing.get_origin(a) is Annotated else a
        for a in typing.get_args(kind)}


def _choices(kind) -> tuple[str, ...] | None:
    if typing.get_origin(kind) is Literal:
        return typing.get_args(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return tuple(member.value for member in kind)
    return None


def _metavar(kind) -> str:
    """N for integers, X for numbers, TEXT for strings (an optional's inner type)."""
    inner = {t for t in typing.get_args(kind) if t is not type(None)} or {kind}
    return "N" if inner == {int} else "X" if inner == {float} else "TEXT"


class _Repeated(argparse.Action):
    """Given once, the flag's value is its text; repeated, the list of every text given."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, values if before is None else [*per_model(before), values])


def _comma_list(text: str) -> list[str]:
    """`0,1` -> ["0", "1"]; a range of numbers is every number in it: `0-3` -> 0, 1, 2, 3."""
    items = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        low, dash, high = item.partition("-")
        if dash and low.isdigit() and high.isdigit() and int(low) <= int(high):
            items += [str(i) for i in range(int(low), int(high) + 1)]
        else:
            items.append(item)
    return items


def _comma_dict(text: str) -> dict[str, str]:
    """`a=2,b=1` -> {"a": "2", "b": "1"} (the values converted as TOML's are)."""
    table = {}
    for item in _comma_list(text):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=VALUE")
        table[key.strip()] = value.strip()
    return table


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    overrides = {name: getattr(args, name, None) for name in FLAT}
    return load_config(getattr(args, "config", None), overrides)
