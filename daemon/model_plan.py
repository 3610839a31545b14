"""Several models in one daemon (MuxServe's setting): which instances serve which model.

`serve` takes one model folder or a list of them (`[model] model`, `--model` repeated).
Each model gets its own served name (`served_model_name`, one per model; "" or left out:
the folder's name), its own layout (`[instances] layout`: one string for every model, or
one per model) and so its own group of engine instances behind a controller of its own.
Instance ids are global: the first model's instances are 0..n-1, the next model's
follow, and `gpus` is dealt out over all of them in that order, `gpus_per_instance`
each. With one model this is exactly the single-model layout of before.

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


def per_model(value: str | list[str]) -> list[str]:
    """A field given as one string or as a list (one per model), as a list."""
    return [value] if isinstance(value, str) else list(value)


def plan_models(folders: str | list[str], names: str | list[str], layouts: str | list[str],
                gpus: list[int] | None = None, gpus_per_instance: int = 1) -> list[ModelPlan]:
    """Each model's name, layout and instances. Raises ValueError naming the field
    (`model.model`, `model.served_model_name`, `instances.layout`, `instances.gpus`)."""
    folders = per_model(folders)
    if not folders:
        raise ValueError("model.model: the list of models is empty; give at least one folder "
                         '(or "" for the built-in tiny model)')
    served = _names(folders, names)
    layouts = [layout or default_layout(gpus, gpus_per_instance, len(folders))
               for layout in _layouts(folders, layouts)]
    plans, next_id = [], 0
    for folder, name, layout in zip(folders, served, layouts):
        modes = layout_modes(layout)
        specs = tuple(InstanceSpec(next_id + i, mode, _gpus(next_id + i, gpus, gpus_per_instance))
                      for i, mode in enumerate(modes))
        plans.append(ModelPlan(name, folder, layout, specs))
        next_id += len(modes)
    if gpus and len(gpus) < next_id * gpus_per_instance:
        raise ValueError(f"instances.gpus: {len(folders)} model(s) with layouts "
                         f"{', '.join(layouts)} need {next_id * gpus_per_instance} GPUs, gpus "
                         f"lists {len(gpus)}")
    return plans


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


def _gpus(index: int, gpus: list[int] | None, per_instance: int) -> tuple[int, ...]:
    return tuple(gpus[index * per_instance:(index + 1) * per_instance]) if gpus else ()
