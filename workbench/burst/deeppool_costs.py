"""The published DeepPool planner's cost model, term by term: each function is the published one
named in its text (seojinpark/DeepPool@7922cac, ``data/PLANNER_COST_MODEL.md``; section numbers
refer to it), quirks included. Times are us, bytes fp32; only the batch is split.

- a layer's configurations: :func:`initial_config` (section 2), :func:`candidates` (the batch
  split ``int(B / 2**k)``, visited in order), :func:`gpus_needed`;
- its own time: :func:`compute_us` (the profile table's row, 1 us when missing),
  :func:`sync_us` (the gradient's all-reduce, no latency), :func:`no_parallel_us` (the
  unsplit layer) and :func:`amplification_of` (what the search judges a layer by);
- the activation moving between two layers (section 5): :func:`activation_path` picks the
  formula, :func:`activation_bytes` gives ``(egress, ingress)``, :func:`activation_us` the booked
  time (forward and backward, latency, the x1000 penalty into ReLU/flatten).

The search that combines them is :mod:`workbench.burst.deeppool`.

Pure Python: no torch, no MPI, no numpy.
"""
from __future__ import annotations

import math

from .graph import Layer, ProfileTable

#: network bandwidth, bytes/us (the examples' ``netBw=2.66E5``, "2128 Gbps")
BANDWIDTH = 2.66e5
#: network latency per transfer, us (PP:66)
LATENCY_US = 240.0
#: layers whose unsplit time is at most this are never judged by amplification, us
EXEMPT_US = 300.0
#: multiplier on a transfer into ReLU2d/ReLU1d/flatten (PP:210-212)
PENALTY = 1000.0
#: bytes per parameter and per activation value (fp32)
BYTES = 4

TYPES_2D, TYPES_1D = ("conv2d", "maxPool2d", "avgPool2d", "adAvgPool2d", "ReLU2d", "concat"), ("linear", "ReLU1d")
PENALIZED, _FLAT4 = ("ReLU2d", "ReLU1d", "flatten"), ("flatten",) + TYPES_2D[1:]


def _dims(dim) -> tuple:
    return (dim,) if isinstance(dim, int) else tuple(dim)


def initial_config(layer: Layer, batch: int) -> tuple:
    """``getInitialConfig`` (section 2): conv2d ``(B, W, H, C, F=output H)``, linear/ReLU1d
    ``(B, in, out)``, pools/ReLU2d/flatten/concat ``(B, W, H, C)``, else ``(B, *inputDim)``."""
    i, o = _dims(layer.input_dim), _dims(layer.output_dim)
    if layer.type == "conv2d":
        return (batch, i[1], i[2], i[0], o[2])
    if layer.type in TYPES_1D:
        return (batch, *i, *o)
    if layer.type in _FLAT4:
        return (batch, i[1], i[2], i[0])
    return (batch, *i)


def candidates(layer: Layer, batch: int, gpus: int, data_parallel: bool = False) -> list[tuple]:
    """``listConfigOptions``: ``b = int(B / 2**k)``, ``k = 0..log2 G`` (only ``log2 G`` in
    data-parallel mode), configs with an entry < 1 dropped; visited in this order."""
    init, splits = initial_config(layer, batch), gpus.bit_length() - 1
    ks = [splits] if data_parallel else range(splits + 1)
    return [c for c in ((int(init[0] / 2 ** k), *init[1:]) for k in ks) if min(c) >= 1]


def gpus_needed(layer: Layer, config: tuple, batch: int) -> int:
    """``calcGpusNeeded``: ``prod int(init[i] / config[i])`` (= ``B / b`` here)."""
    out = 1
    for a, b in zip(initial_config(layer, batch), config):
        out *= int(a / b)
    return out


def compute_us(table: ProfileTable, layer: Layer, batch_per_gpu: int) -> float:
    """``benchGpuTime``: the table's forward+backward time (us) at ``batch_per_gpu``; **1 us**
    when the row is missing or not positive. No interpolation."""
    row = table.get(layer, batch_per_gpu)
    return row.avg_us if row is not None and row.avg_us > 0 else 1


def sync_us(layer: Layer, config: tuple, batch: int, bandwidth: float = BANDWIDTH) -> float:
    """``calcSyncTime``: conv2d ``4*(kW*kH*config[4] + kW*kH)/BW`` with ``kH = 1`` for an int
    kernel and ``config[4]`` = output H; linear ``4*(in*out + out)/BW``, 0 when unsplit
    (``config[0] == batch``); every other type 0. No latency, no replica factor."""
    if layer.type == "conv2d":
        k = layer.params["kernel_size"]
        kw, kh = (k[0], k[1]) if isinstance(k, (list, tuple)) else (k, 1)
        return (kw * kh * config[4] + kw * kh) * BYTES / bandwidth
    if layer.type == "linear":
        return 0 if config[0] == batch else (config[1] * config[2] + config[2]) * BYTES / bandwidth
    return 0


def no_parallel_us(table: ProfileTable, layer: Layer, batch: int, bandwidth: float = BANDWIDTH) -> float:
    """Compute + sync of the unsplit layer (the amplification denominator)."""
    init = initial_config(layer, batch)
    return compute_us(table, layer, init[0]) + sync_us(layer, init, batch, bandwidth)


def amplification_of(layer_us: float, gpus: int, no_parallel: float) -> float:
    """``layerTime * gpus / noParallelTime``, or 1 if ``layerTime <= 0`` or the unsplit time is
    at most :data:`EXEMPT_US` (PP:1518-1521)."""
    return (layer_us * gpus) / no_parallel if (layer_us > 0 and no_parallel > EXEMPT_US) else 1


def activation_path(src: Layer, dst: Layer) -> str:
    """``2d``, ``linear`` or ``general``: which formula ``calcInputXfer`` uses."""
    if src.type in TYPES_2D and dst.type in TYPES_2D + ("flatten",):
        return "2d"
    if src.type in TYPES_1D + ("flatten",) and dst.type in TYPES_1D:
        return "linear"
    return "general"


def activation_bytes(src: Layer, dst: Layer, src_cfg: tuple, dst_cfg: tuple,
                     no_gpu_overlap: bool = False) -> tuple[float, float]:
    """``(egress, ingress)`` bytes of the activation moving from ``src`` at ``src_cfg`` into
    ``dst`` at ``dst_cfg`` by the path's formula (section 5; the 2-D path's channel count is
    ``src_cfg[4]`` for a conv source, i.e. its output H)."""
    s, d, path = src_cfg[0], dst_cfg[0], activation_path(src, dst)
    if path == "2d":
        si, so = _dims(src.input_dim), _dims(src.output_dim)
        sw, sh = src_cfg[1] * so[1] // si[1], src_cfg[2] * so[2] // si[2]
        ch = src_cfg[4] if len(src_cfg) >= 5 else src_cfg[3]
        dw, dh = dst_cfg[1], dst_cfg[2]
        src_gpus, dst_gpus = gpus_needed(src, src_cfg, s * d), gpus_needed(dst, dst_cfg, s * d)
        src_no_ind, dst_no_ind = not src_gpus > dst_gpus, not src_gpus < dst_gpus
        common = 0 if no_gpu_overlap else BYTES * min(s, d) * min(sw, dw) * min(sh, dh) * ch
        k = dst.params.get("kernel_size", 1)
        hw, hh = ((int((k[0] - 1) / 2), int((k[1] - 1) / 2)) if isinstance(k, (list, tuple))
                  else (int((k - 1) / 2),) * 2) if "kernel_size" in dst.params else (0, 0)
        di = _dims(dst.input_dim)
        pixels = 2 * hw * ((dh + hh) if dw != di[1] else 0) + 2 * hh * ((dw + hw) if dh != di[2] else 0)
        halo = BYTES * min(s, d) * pixels * ch
        egress = BYTES * s * sw * sh * ch + (halo - common if src_no_ind else halo)
        ingress = BYTES * d * dw * dh * ch + (halo - common if dst_no_ind else halo)
        return egress, ingress
    if path == "linear":
        if len(src_cfg) >= 4:
            so, si = _dims(src.output_dim), _dims(src.input_dim)
            sw = src_cfg[1] * 1 if src.type == "flatten" else so[1] // si[1]
            sh = src_cfg[2] * 1 if src.type == "flatten" else so[2] // si[2]
            f_src, split = sw * sh * (src_cfg[4] if len(src_cfg) >= 5 else src_cfg[3]), 1
        else:
            f_src, split = src_cfg[2], src.input_dim / src_cfg[1]
        f_dst = dst_cfg[1]
    else:
        f_src, f_dst, split = math.prod(_dims(src.output_dim)), math.prod(_dims(dst.input_dim)), 1
    common = 0 if no_gpu_overlap else BYTES * min(s, d) * min(f_src, f_dst)
    return BYTES * s * f_src * split - common, BYTES * d * f_dst * split - common


def activation_us(src: Layer, dst: Layer, src_cfg: tuple, dst_cfg: tuple, no_gpu_overlap: bool = False,
                  bandwidth: float = BANDWIDTH, latency_us: float = LATENCY_US) -> float:
    """``calcInputXfer``: ``2 * (max(egress, ingress)/BW + LAT if > 0)``, times
    :data:`PENALTY` when ``dst`` is ReLU2d/ReLU1d/flatten."""
    t = max(activation_bytes(src, dst, src_cfg, dst_cfg, no_gpu_overlap)) / bandwidth
    t += latency_us if t > 0 else 0
    return 2 * t * (PENALTY if dst.type in PENALIZED else 1)
