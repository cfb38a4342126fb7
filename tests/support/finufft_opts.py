"""An options object shaped as jax-finufft's ``Opts`` (jax_finufft.options), for the drop-in's
tests, without installing jax-finufft (a compiled FINUFFT and FFTW, built against one JAX,
and pydantic): a frozen dataclass with its field names, types and defaults, and its enums
(integers: FFTW's planner flags, FINUFFT's sort and thread modes), as callers build it.
"""

from dataclasses import dataclass
from enum import IntEnum


class DebugLevel(IntEnum):
    Silent = 0
    Verbose = 1
    Noisy = 2


class FftwFlags(IntEnum):  # FFTW's planner flags (fftw3.h)
    Measure = 0
    Exhaustive = 1 << 3
    Patient = 1 << 5
    Estimate = 1 << 6
    WisdomOnly = 1 << 21


class SpreadSort(IntEnum):
    NoSort = 0
    Sort = 1
    Heuristic = 2


class SpreadThread(IntEnum):
    Auto = 0
    Sequential = 1
    Parallel = 2


class GpuMethod(IntEnum):
    Auto = 0
    Driven = 1
    Shared = 2


@dataclass(frozen=True)
class FinufftStyleOpts:
    """jax-finufft's ``Opts`` fields with its defaults (its ``fftw`` default is
    FFTW_ESTIMATE, 64)."""

    modeord: bool = False
    debug: DebugLevel = DebugLevel.Silent
    spread_debug: DebugLevel = DebugLevel.Silent
    showwarn: bool = False
    nthreads: int = 0
    fftw: int = FftwFlags.Estimate
    spread_sort: SpreadSort = SpreadSort.Heuristic
    spread_kerevalmeth: bool = True
    spread_kerpad: bool = True
    upsampfac: float = 0.0
    spread_thread: SpreadThread = SpreadThread.Auto
    maxbatchsize: int = 0
    spread_nthr_atomic: int = -1
    spread_max_sp_size: int = 0
    gpu_upsampfac: float = 2.0
    gpu_method: GpuMethod = GpuMethod.Auto
    gpu_sort: bool = True
    gpu_binsizex: int = 0
    gpu_binsizey: int = 0
    gpu_binsizez: int = 0
    gpu_obinsizex: int = 0
    gpu_obinsizey: int = 0
    gpu_obinsizez: int = 0
    gpu_maxsubprobsize: int = 1024
    gpu_kerevalmeth: bool = True
    gpu_spreadinterponly: bool = False
    gpu_maxbatchsize: int = 0
    gpu_debug: int = 0
