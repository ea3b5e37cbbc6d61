"""The CPU's identity from /proc/cpuinfo, without torch (the service launcher reads it too): the engine's
kernel and speculation defaults are measured per vendor."""

from __future__ import annotations

import functools


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (empty when unreadable)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first CPU's block
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_vendor() -> str:
    """``vendor_id`` from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...; "" when unknown)."""
    return _cpuinfo().get("vendor_id", "")


def cpu_model() -> str:
    """``model name`` from /proc/cpuinfo ("" when unknown)."""
    return _cpuinfo().get("model name", "")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo ("avx512f", "amx_tile", ...; empty when unknown)."""
    return frozenset(_cpuinfo().get("flags", "").split())


def _by_vendor(table: dict[str, int], default: int, vendor: str | None) -> int:
    """``table``'s value for ``vendor`` (default: this CPU's), else ``default``."""
    return table.get(cpu_vendor() if vendor is None else vendor, default)


# SpecConfig.max_batch where a vendor measured otherwise than the default. Intel Xeon (stop 43, 2 cores,
# AMX), plain steps on both threads (below): greedy PR over plain decoding 1.40x at batch 1, 1.29x at 2,
# 1.08x at 4, 0.93x at 6, 0.85x at 8 (tools/spec_batch_speed.py 1,2,4,6,8 --reps 4); one sampled Gambit
# run with PR 1.00-1.09x plain's wall at C = 4 (gambit bench search --quick --problems 16 --concurrency 1
# --capacity 4 --methods gambit,gambit_pr). Its plain steps are cheap (MKL's packed GEMM at 2-32 rows,
# both threads), so a tree stops paying at a smaller batch than on AMD (1.29-1.47x at 8).
SPEC_MAX_BATCH = 8
SPEC_MAX_BATCH_BY_VENDOR = {"GenuineIntel": 4}


def default_spec_max_batch(vendor: str | None = None) -> int:
    """The batch size up to which speculative traces draft by default on this CPU's vendor."""
    return _by_vendor(SPEC_MAX_BATCH_BY_VENDOR, SPEC_MAX_BATCH, vendor)


# EngineConfig.min_macs_per_thread by vendor. AMD EPYC (2 cores): one thread steps the shipped target's
# 1-8 rows 0.90-1.07x as long as two (a wash, and the other core stays free for the services), 1.14x at
# 16. Intel Xeon (stop 43, 2 cores, AMX; tools/step_threads_curve.py 5): one thread 1.14x as long at 1
# row, 1.30x at 2, 1.28x at 4, 1.27x at 8, 1.41x at 16: two threads win at every batch, so every step
# gets both (a threshold under the target's 2.67M multiply-adds a row).
MIN_MACS_PER_THREAD = 16_000_000
MIN_MACS_PER_THREAD_BY_VENDOR = {"GenuineIntel": 1_000_000}


def default_min_macs_per_thread(vendor: str | None = None) -> int:
    """The engine's per-thread work floor for a CPU step on this CPU's vendor."""
    return _by_vendor(MIN_MACS_PER_THREAD_BY_VENDOR, MIN_MACS_PER_THREAD, vendor)


CPU_WEIGHTS = ("float32", "bfloat16")  # the CPU linears' weight precision (EngineConfig.cpu_weights)
KV_DTYPES = ("auto", "float32", "bfloat16")  # the KV cache's element type (EngineConfig.kv_dtype)


def check_kv_dtype(value: str) -> None:
    """``kv_dtype`` as every config that carries it checks it (engine, embedded wiring, launcher)."""
    if value not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be auto, float32 or bfloat16, got {value!r}")


def check_cpu_weights(value: str) -> None:
    """``cpu_weights`` as every config that carries it checks it (engine, embedded wiring, launcher)."""
    if value not in CPU_WEIGHTS:
        raise ValueError(f"cpu_weights must be float32 or bfloat16, got {value!r}")
