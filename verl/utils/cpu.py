"""What this machine's CPU can do, from /proc/cpuinfo and the process's affinity: the thread count and the
compute dtype of a run depend on it (:mod:`verl.utils.threads`, :mod:`verl.utils.precision`), and
``verl doctor`` shows it."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

CPU_FEATURES: dict[str, str] = {
    "avx2": "the vectorised kernels torch's CPU build expects at least",
    "avx512f": "AVX-512: wider fp32 kernels",
    "avx512_bf16": "bf16 dot products: torch_dtype=bfloat16 runs on a fast path",
    "amx_tile": "AMX tiles (with amx_bf16: bf16 matrix multiplies in hardware)",
    "amx_bf16": "AMX bf16: the fastest bf16 matrix multiplies on a CPU",
    "avx512_vnni": "int8 dot products (quantised inference)",
}
"""the /proc/cpuinfo flags that matter here, and what each one means for a run"""

BF16_FAST_FLAGS = ("avx512_bf16", "amx_bf16")
"""without either, bf16 on a CPU is emulated: slower than fp32, not faster"""


BF16_ONEDNN_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10", "ALL", "DEFAULT")
"""``ONEDNN_MAX_CPU_ISA`` values (prefixes) that leave oneDNN its bf16 kernels"""


def bf16_kernels_capped(env: dict[str, str] | None = None) -> str | None:
    """The setting that caps PyTorch's or oneDNN's kernels below bf16 (``ONEDNN_MAX_CPU_ISA=AVX2``,
    ``ATEN_CPU_CAPABILITY=avx2``: how one machine computes as an older CPU would), or None. With such a cap a
    bf16 CPU cannot run bf16: oneDNN refuses its bf16 weight layout ("bf16 path needs the cpu support ...")."""
    env = os.environ if env is None else env
    for key in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        isa = env.get(key, "").strip().upper()
        if isa and not isa.startswith(BF16_ONEDNN_ISAS):
            return f"{key}={env[key]}"
    capability = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if capability in ("default", "avx2"):
        return f"ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']}"
    return None


@dataclass(frozen=True)
class CpuInfo:
    """The CPU model and its feature flags (from /proc/cpuinfo)."""

    model: str
    flags: frozenset[str]

    @property
    def bf16_fast(self) -> bool:
        return any(flag in self.flags for flag in BF16_FAST_FLAGS)


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's ``model name`` and ``flags`` of a /proc/cpuinfo text (empty when absent, e.g.
    on a non-Linux system or an ARM CPU, which names its ``Features`` instead)."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model or platform.processor() or "unknown", flags)


def read_cpuinfo(path: str = "/proc/cpuinfo") -> CpuInfo:
    try:
        return parse_cpuinfo(Path(path).read_text())
    except OSError:
        return parse_cpuinfo("")


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> tuple[int, float | None]:
    """The cores this process may run on (``os.sched_getaffinity``) and the cgroup's CPU quota in cores
    (``cpu.max``), None when there is none."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = None
    try:
        limit, period = Path(cgroup_root, "cpu.max").read_text().split()[:2]
        if limit != "max":
            quota = int(limit) / int(period)
    except (OSError, ValueError):
        pass
    return cores, quota
