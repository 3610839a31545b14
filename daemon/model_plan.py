"""Several models in one daemon (MuxServe's setting): which instances serve which model.

`serve` takes one model folder or a list of them (`[model] model`, `--model` repeated).
Each model gets its own served name (`served_model_name`, one per model; "" or left out:
the folder's name), its own layout (`[instances] layout`: one string for every model, or
one per model) and so its own group of engine instances behind a controller of its own.
Instance ids are global: the first model's instances are 0..n-1, the next model's
follow, and `gpus` is dealt out over all of them in that order, `gpus_per_instance`
each. With one model this is exactly the single-model layout of before.

With `placement` (`[model] placement`) models share instances instead: "multiplexed"
puts every model on every instance of one group, a list names each model's group
("dedicated" = a group of its own). A group of several models is one plan -- its first
model's name, folder, layout and tp -- whose `multiplexed` lists every (name, folder) its
instances hold (engines/mux_core.py); one controller serves the group. `[model] groups`
says it outright, one "NAME+NAME:LAYOUT" per group, and may put a model in several
groups (multiplexed on some GPUs, dedicated on others): the API then sends each of its
requests to the least loaded of them (daemon/served_models.py).

Pure: it reads no folder (the built-in tiny model's name comes from its cache path).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from daemon.layout import InstanceSpec, default_layout, layout_modes
from engines.models.builtin import builtin_tiny_model_dir_name


@dataclass(frozen=True)
class ModelPlan:
    name: str                         # the name clients send and /v1/models lists
    folder: str                       # "" = the built-in tiny model
    layout: str
    instances: tuple[InstanceSpec, ...]  # global ids, in id order
    tp: int = 1                       # each instance's tensor-parallel degree (ranks)
    #: A multiplexed group: every (name, folder) its instances hold, this plan's first;
    #: empty: one model.
    multiplexed: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> list[str]:
        """The served names this plan's instances answer for."""
        return [name for name, _ in self.multiplexed] or [self.name]

    @property
    def label(self) -> str:
        """Its controller's name in /health and /metrics: its model's, a group's joined
        by "+" (a model may be in a group and have instances of its own too)."""
        return "+".join(self.names)


def per_model(value: str | list[str]) -> list[str]:
    """A field given as one string or as a list (one per model), as a list."""
    return [value] if isinstance(value, str) else list(value)


def plan_models(folders: str | list[str], names: str | list[str], layouts: str | list[str],
                gpus: list[int] | None = None, gpus_per_instance: int = 1,
                tp: int | list[int] = 1, placement: str | list[str] = "dedicated",
                groups: list[str] | None = None) -> list[ModelPlan]:
    """Each model's (or multiplexed group's) name, layout and instances. Raises ValueError
    naming the field (`model.model`, `model.served_model_name`, `model.placement`,
    `model.groups`, `instances.layout`, `instances.gpus`, `instances.tp`)."""
    folders = per_model(folders)
    if not folders:
        raise ValueError("model.model: the list of models is empty; give at least one folder "
                         '(or "" for the built-in tiny model)')
    served = _names(folders, names)
    degrees = _degrees(folders, tp)
    layouts_given = _layouts(folders, layouts)
    if groups:
        if placement != "dedicated" or any(layouts_given):
            raise ValueError("model.groups: it names each group's models and layout; leave "
                             "model.placement and instances.layout unset with it")
        planned = _explicit_groups(groups, served)
    else:
        planned = [(members, layouts_given[members[0]])
                   for members in _groups(folders, placement)]
    if any(len(members) > 1 and degrees[members[0]] > 1 for members, _ in planned):
        raise ValueError("model.placement: a multiplexed group runs at tp 1 (its models "
                         "share one device); set instances.tp to 1 for its models")
    layouts = [layout or default_layout(gpus, instance_gpus(degrees[members[0]],
                                                            gpus_per_instance), len(planned))
               for members, layout in planned]
    plans, next_id, next_gpu = [], 0, 0
    for (members, _), layout in zip(planned, layouts):
        first, degree = members[0], degrees[members[0]]
        modes = layout_modes(layout)
        if len(members) > 1 and {"prefill", "decode"} & set(modes):
            raise ValueError(f"model.placement: the multiplexed group of {served[first]!r} "
                             f"has layout {layout!r}; P/D layouts hand KV between instances "
                             "of one model and are not multiplexed")
        each = instance_gpus(degree, gpus_per_instance)
        specs = []
        for i, mode in enumerate(modes):
            specs.append(InstanceSpec(next_id + i, mode,
                                      tuple(gpus[next_gpu:next_gpu + each]) if gpus else ()))
            next_gpu += each
        multiplexed = tuple((served[i], folders[i]) for i in members) if len(members) > 1 else ()
        plans.append(ModelPlan(served[first], folders[first], layout, tuple(specs), degree,
                               multiplexed))
        next_id += len(modes)
    if gpus and len(gpus) < next_gpu:
        used = [degrees[members[0]] for members, _ in planned]
        degree = f" at tp {', '.join(map(str, used))}" if max(used) > 1 else ""
        raise ValueError(f"instances.gpus: {len(planned)} model group(s) with layouts "
                         f"{', '.join(layouts)}{degree} need {next_gpu} GPUs, gpus "
                         f"lists {len(gpus)}")
    return plans


def _explicit_groups(groups: list[str], served: list[str]) -> list[tuple[list[int], str]]:
    """`model.groups`: each "NAME+NAME:LAYOUT" (models by served name, the first the
    group's default); a model may be in several groups, and must be in one."""
    planned = []
    for text in groups:
        names, colon, layout = text.partition(":")
        members = [n.strip() for n in names.split("+") if n.strip()]
        unknown = [n for n in members if n not in served]
        if not colon or not layout.strip() or not members or unknown or \
                len(set(members)) != len(members):
            raise ValueError(f"model.groups: {text!r} is not NAME+NAME:LAYOUT over the served "
                             f"names ({', '.join(served)})"
                             + (f"; {', '.join(map(repr, unknown))} is not served" if unknown
                                else ""))
        planned.append(([served.index(n) for n in members], layout.strip()))
    missing = [n for i, n in enumerate(served) if not any(i in m for m, _ in planned)]
    if missing:
        raise ValueError(f"model.groups: {', '.join(map(repr, missing))} is in no group")
    return planned


def instance_gpus(tp: int, gpus_per_instance: int) -> int:
    """GPUs one instance takes from `gpus`: one per rank at tp > 1."""
    if tp > 1 and gpus_per_instance not in (1, tp):
        raise ValueError(f"instances.gpus_per_instance: {gpus_per_instance} conflicts with "
                         f"tp {tp} (an instance at tp {tp} takes {tp} GPUs, one per rank)")
    return tp if tp > 1 else gpus_per_instance


def _groups(folders: list[str], placement: str | list[str]) -> list[list[int]]:
    """The models' indices, grouped by the instances they share, in order of first model."""
    if placement in ("dedicated", "multiplexed"):
        labels = [f"#{i}" for i in range(len(folders))] if placement == "dedicated" else (
            ["all"] * len(folders))
    elif isinstance(placement, str):
        raise ValueError(f"model.placement: {placement!r} is neither \"dedicated\" nor "
                         "\"multiplexed\" (or a list with a group name per model)")
    elif len(placement) != len(folders):
        raise ValueError(f"model.placement: {len(placement)} entries for {len(folders)} models; "
                         "give one per model (\"dedicated\" or a group name)")
    else:
        labels = [f"#{i}" if p == "dedicated" else p for i, p in enumerate(placement)]
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    return list(groups.values())


def _degrees(folders: list[str], tp: int | list[int]) -> list[int]:
    if isinstance(tp, int):
        return [tp] * len(folders)
    if len(tp) != len(folders):
        raise ValueError(f"instances.tp: {len(tp)} degree(s) for {len(folders)} models; give "
                         "one for all, or one per model in the order of model.model")
    return list(tp)


def default_name(folder: str) -> str:
    """The name a model is served under when none is given: its folder's name."""
    return Path(folder).name if folder else builtin_tiny_model_dir_name()


def _names(folders: list[str], names: str | list[str]) -> list[str]:
    given = per_model(names)
    if given == [""]:
        given = [""] * len(folders)
    if len(given) != len(folders):
        raise ValueError(f"model.served_model_name: {len(given)} name(s) for {len(folders)} "
                         "models; give one per model, in the order of model.model")
    served = [name or default_name(folder) for name, folder in zip(given, folders)]
    for i, name in enumerate(served):
        if not name:
            raise ValueError(f"model.served_model_name: model {folders[i]!r} has no name of its "
                             "own (its folder has none); give it one")
        if name in served[:i]:
            raise ValueError(f"model.served_model_name: two models are named {name!r} "
                             f"({folders[served.index(name)]!r} and {folders[i]!r}); give each "
                             "its own name with served_model_name (--served-model-name, once "
                             "per model)")
    return served


def _layouts(folders: list[str], layouts: str | list[str]) -> list[str]:
    if isinstance(layouts, str):
        return [layouts] * len(folders)  # every model the same layout
    if len(layouts) != len(folders):
        raise ValueError(f"instances.layout: {len(layouts)} layout(s) for {len(folders)} models; "
                         "give one layout for all, or one per model in the order of model.model")
    return list(layouts)

