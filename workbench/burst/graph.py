"""The planner's inputs: a model as a graph of layers, and a table of per-layer times per
per-GPU batch size. One format for DeepPool's published A100 tables (``data/profiles/*.prof``,
``data/models/*.json``: see ``data/README.md``, MIT, notice in ``data/LICENSE-DeepPool.txt``) and
for the tables :func:`workbench.burst.profiler.profile` (``workbench.burst.profile``) measures here.

    from workbench.burst.graph import load_model, load_profile
    model = load_model("vgg16")              # a built-in name or a path to a model JSON
    table = load_profile(model.profile_path)  # ProfileTable: key -> LayerTime (us)
    table.time(model.layers[0], 8)            # LayerTime(avg_us, fw_us, bw_us) at 8 samples per GPU
    table.batches(model.layers[0])            # the per-GPU batch sizes measured for that layer

**Model JSON** (``data/models/<name>.json``): ``model``, ``title``, ``inputDim``,
``profileFile`` (relative to the JSON's folder's parent), ``numLayers``, ``totalParamCount``,
``layers``: each with ``id``, ``type``, ``params``, ``prev``, ``next`` (ids), ``inputDim``,
``outputDim`` (``[C, H, W]`` or an int), ``paramCount``, ``profileKeyPrefix``,
``profileKeySuffix`` and ``profiledPerGpuBatches``. Layer ids are list positions in a topological
order; a layer with several ``next`` is a fork, one with several ``prev`` a join.

**Profile table**: one line per measurement, ``<key> <avg_ms> <fw_us> <bw_us>`` (or ``<key>
<avg_ms> [p50 p90 p99]``: the ``*LayerGpuProfile*`` tables), ``key = prefix + "[" + b + "]" +
suffix``; ``#`` lines and ``SUM(avg)`` / ``sum:`` trailers are skipped; a key seen twice keeps its
**last** line (the published planner's rule). Times are held in microseconds.

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

#: where the shipped DeepPool data lies (MIT; keep data/LICENSE-DeepPool.txt with it)
DATA = Path(__file__).resolve().parent / "data"
#: built-in model names -> their JSON under data/models
MODELS = {"vgg16": "vgg16.json", "wrn101_2": "wrn101_2.json", "inception_v3": "inception_v3.json"}
#: spellings accepted for the built-in names
ALIASES = {"wide_resnet101_2": "wrn101_2", "wrn": "wrn101_2", "vgg": "vgg16", "inception": "inception_v3"}


class BurstError(ValueError):
    """Bad input to the burst-parallel planner, profiler or executor; the message names it."""


@dataclass(frozen=True)
class Layer:
    """One planner layer (see the module's text for the fields)."""

    id: int
    type: str
    params: dict = field(hash=False, compare=False)
    prev: tuple[int, ...]
    next: tuple[int, ...]
    input_dim: tuple[int, ...] | int
    output_dim: tuple[int, ...] | int
    param_count: int
    key_prefix: str
    key_suffix: str
    profiled: tuple[int, ...] = ()

    def key(self, batch: int) -> str:
        """The profile key of this layer at ``batch`` samples per GPU."""
        return f"{self.key_prefix}[{batch}]{self.key_suffix}"

    @property
    def output_elements(self) -> int:
        """Activation values per sample leaving this layer."""
        return _elements(self.output_dim)

    def to_dict(self) -> dict:
        return {"id": self.id, "type": self.type, "params": self.params, "prev": list(self.prev),
                "next": list(self.next), "inputDim": _dim_out(self.input_dim), "outputDim": _dim_out(self.output_dim),
                "paramCount": self.param_count, "profileKeyPrefix": self.key_prefix,
                "profileKeySuffix": self.key_suffix, "profiledPerGpuBatches": list(self.profiled)}


def _elements(dim) -> int:
    return int(dim) if isinstance(dim, int) else int(math.prod(dim))


def _dim_in(dim):
    return int(dim) if isinstance(dim, (int, float)) else tuple(int(d) for d in dim)


def _dim_out(dim):
    return dim if isinstance(dim, int) else list(dim)


@dataclass
class ModelGraph:
    """A model as the planner sees it: ``layers`` in topological order (ids = positions)."""

    name: str
    layers: list[Layer]
    input_dim: tuple[int, ...] | int
    title: str = ""
    total_params: int | None = None
    profile_path: Path | None = None

    def __post_init__(self) -> None:
        check_graph(self.layers)

    @property
    def params(self) -> int:
        """Trainable parameters of the listed layers."""
        return sum(layer.param_count for layer in self.layers)

    def is_chain(self) -> bool:
        return all(len(l.prev) <= 1 and len(l.next) <= 1 for l in self.layers)

    def to_dict(self) -> dict:
        out = {"model": self.name, "title": self.title, "inputDim": _dim_out(self.input_dim),
               "numLayers": len(self.layers), "totalParamCount": self.total_params or self.params,
               "layers": [l.to_dict() for l in self.layers]}
        if self.profile_path is not None:
            out["profileFile"] = str(self.profile_path)
        return out

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def check_graph(layers: list[Layer]) -> None:
    """Ids are positions, edges are mutual and point forward (a topological order), one input
    layer; else :class:`BurstError` naming the layer."""
    if not layers:
        raise BurstError("model has no layers")
    n = len(layers)
    for i, layer in enumerate(layers):
        if layer.id != i:
            raise BurstError(f"layer ids must be their positions 0..{n - 1}; layer {i} has id {layer.id}")
        for p in layer.prev:
            if not 0 <= p < i or i not in layers[p].next:
                raise BurstError(f"layer {i}: prev {p} is not an earlier layer listing {i} as next")
        for q in layer.next:
            if not i < q < n or i not in layers[q].prev:
                raise BurstError(f"layer {i}: next {q} is not a later layer listing {i} as prev")
    roots = [l.id for l in layers if not l.prev]
    if roots != [0]:
        raise BurstError(f"model must have one input layer, layer 0; layers without prev: {roots}")


@dataclass(frozen=True, eq=False)
class Block:
    """A fork layer, its branches (tuples of items: layer ids and nested blocks) and their join."""

    fork: int
    branches: tuple
    join: int


def structure(model: ModelGraph) -> tuple:
    """The model as items in order (the planner's view): layer ids, a :class:`Block` between each
    fork and its join; :class:`BurstError` unless the graph is series-parallel."""
    layers = model.layers

    def segment(lid):
        items = []
        while True:
            items.append(lid)
            nxt = layers[lid].next
            if not nxt:
                return items, None
            if len(nxt) == 1:
                if len(layers[nxt[0]].prev) > 1:
                    return items, nxt[0]
                lid = nxt[0]
                continue
            ends = [segment(n) if len(layers[n].prev) == 1 else ((), n) for n in nxt]   # () goes straight to the join
            branches, joins = [tuple(b) for b, _ in ends], {end for _, end in ends}
            join = joins.pop() if len(joins) == 1 else None
            if join is None or sorted(layers[join].prev) != sorted(b[-1] if b else lid for b in branches):
                raise BurstError(f"the branches of fork layer {lid} do not all end at one join layer; only "
                                 f"series-parallel graphs can be planned")
            items.append(Block(lid, tuple(branches), join))
            lid = join

    items, end = segment(0)
    if end is not None:
        raise BurstError(f"layer {end} joins branches that no fork opened; only series-parallel graphs can be planned")
    return tuple(items)   # every layer is in it: each but layer 0 has an earlier input (check_graph)


def layer_from_dict(d: dict) -> Layer:
    return Layer(int(d["id"]), str(d["type"]), dict(d.get("params", {})), tuple(int(x) for x in d.get("prev", ())),
                 tuple(int(x) for x in d.get("next", ())), _dim_in(d["inputDim"]), _dim_in(d["outputDim"]),
                 int(d.get("paramCount", 0)), str(d.get("profileKeyPrefix", "")), str(d.get("profileKeySuffix", "")),
                 tuple(int(b) for b in d.get("profiledPerGpuBatches", ())))


def model_path(name_or_path: str | Path) -> Path:
    """A built-in model's JSON (``vgg16``, ``wrn101_2``, ``inception_v3``) or a given path."""
    text = str(name_or_path)
    name = ALIASES.get(text, text)
    if name in MODELS:
        return DATA / "models" / MODELS[name]
    path = Path(text)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise BurstError(f"model: no file at {path}")
        return path
    raise BurstError(f"model must be one of {', '.join(MODELS)} or a model JSON file; got {text!r}")


def load_model(name_or_path: str | Path) -> ModelGraph:
    """A :class:`ModelGraph` from a built-in name or a model JSON (see the module's text)."""
    path = model_path(name_or_path)
    try:
        d = json.loads(path.read_text())
        layers = [layer_from_dict(l) for l in d["layers"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BurstError(f"model: {path} is not a model JSON ({type(exc).__name__}: {exc})") from None
    profile = d.get("profileFile")
    profile_path = None
    if profile:
        for base in (path.parent.parent, path.parent):
            if (base / profile).exists():
                profile_path = base / profile
                break
    return ModelGraph(str(d.get("model", path.stem)), layers, _dim_in(d.get("inputDim", 0)), str(d.get("title", "")),
                      d.get("totalParamCount"), profile_path)


@dataclass(frozen=True)
class LayerTime:
    """One layer at one per-GPU batch: forward + backward (``avg_us``) and its parts, us."""

    avg_us: float
    fw_us: float
    bw_us: float


@dataclass
class ProfileTable:
    """Measured layer times: key -> :class:`LayerTime` (the last line per key kept)."""

    entries: dict[str, LayerTime] = field(default_factory=dict)
    source: str = ""
    #: (key prefix, suffix) -> measured batches, for the table's current size (a new key renews it;
    #: a row replaced in place keeps the same batches)
    _batches: dict = field(default_factory=dict, repr=False, compare=False)
    _batches_size: int = field(default=-1, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, layer: Layer, batch: int) -> LayerTime | None:
        return self.entries.get(layer.key(batch))

    def time(self, layer: Layer, batch: int) -> LayerTime:
        """The layer's time at ``batch`` samples per GPU; :class:`BurstError` if not measured."""
        found = self.get(layer, batch)
        if found is None:
            have = self.batches(layer)
            raise BurstError(f"profile {self.source or '(table)'} has no row for layer {layer.id} ({layer.type}) at "
                             f"per-GPU batch {batch}; measured batches: {list(have) or 'none'}")
        return found

    def batches(self, layer: Layer) -> tuple[int, ...]:
        """Per-GPU batch sizes with a row for ``layer``, ascending."""
        if self._batches_size != len(self.entries):
            self._batches, self._batches_size = {}, len(self.entries)
        key = (layer.key_prefix, layer.key_suffix)
        if key not in self._batches:
            self._batches[key] = self._scan(layer)
        return self._batches[key]

    def _scan(self, layer: Layer) -> tuple[int, ...]:
        head, tail = layer.key_prefix + "[", "]" + layer.key_suffix
        out = []
        for key in self.entries:
            if key.startswith(head) and key.endswith(tail):
                middle = key[len(head):len(key) - len(tail)]
                if middle.isdigit():
                    out.append(int(middle))
        return tuple(sorted(out))

    def add(self, layer: Layer, batch: int, fw_us: float, bw_us: float) -> None:
        self.entries[layer.key(batch)] = LayerTime(fw_us + bw_us, fw_us, bw_us)

    def write(self, path: str | Path, layers: Iterable[Layer] | None = None) -> Path:
        """Write in the ``.prof`` format: one block per batch size with a ``SUM(avg)`` trailer.
        ``layers`` (optional) gives the row order (else key order)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        by_batch: dict[int, list[tuple[str, LayerTime]]] = {}
        keys = list(self.entries)
        if layers is not None:
            layers = list(layers)
            order = []
            for b in sorted({b for l in layers for b in self.batches(l)}):
                order += [l.key(b) for l in layers if l.key(b) in self.entries]
            keys = list(dict.fromkeys(order + keys))
        for key in keys:
            batch = _batch_of(key)
            by_batch.setdefault(batch, []).append((key, self.entries[key]))
        lines = []
        for batch in sorted(by_batch):
            rows = by_batch[batch]
            lines += [f"{k}  {t.avg_us / 1000:.6f}  {t.fw_us:.3f}  {t.bw_us:.3f}" for k, t in rows]
            lines.append(f"SUM(avg)  {sum(t.avg_us for _, t in rows) / 1000:.6f}")
        path.write_text("\n".join(lines) + "\n")
        return path


def _batch_of(key: str) -> int:
    """The per-GPU batch of a key: the first ``[digits]`` after the params JSON."""
    depth, i = 0, 0
    while i < len(key):
        c = key[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "[" and depth == 0:
            j = key.index("]", i)
            if key[i + 1:j].isdigit():
                return int(key[i + 1:j])
        i += 1
    return -1


def load_profile(path: str | Path) -> ProfileTable:
    """A :class:`ProfileTable` from a ``.prof`` / ``*LayerGpuProfile*.txt`` file (see the module's
    text); a built-in model name gives that model's shipped table."""
    text = str(path)
    if ALIASES.get(text, text) in MODELS:
        model = load_model(text)
        if model.profile_path is None:
            raise BurstError(f"profile: model {text} names no profile file")
        path = model.profile_path
    path = Path(path)
    if not path.exists():
        raise BurstError(f"profile: no file at {path}")
    table = ProfileTable(source=str(path))
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#") or fields[0].startswith("SUM") or fields[0].startswith("sum"):
            continue
        if len(fields) not in (2, 4, 5):
            raise BurstError(f"profile: {path}:{number} has {len(fields)} fields; expected key avg_ms [fw_us bw_us]")
        try:
            avg_us = float(fields[1]) * 1000
            if len(fields) == 4:
                fw, bw = float(fields[2]), float(fields[3])
            else:   # avg (and percentiles) only: no split known
                fw, bw = avg_us, 0.0
        except ValueError:
            raise BurstError(f"profile: {path}:{number}: times must be numbers; got {fields[1:]}") from None
        table.entries[fields[0]] = LayerTime(avg_us, fw, bw)
    if not table.entries:
        raise BurstError(f"profile: {path} holds no layer rows")
    return table
