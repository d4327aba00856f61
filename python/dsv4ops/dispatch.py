"""Which implementation serves a call: the native kernel or the PyTorch reference.

For each op and call, in order:
  1. selected  -- DSV4OPS_DISABLE=op1,op2 (or 'all') sends the op to the reference;
                  DSV4OPS_FORCE=op1,op2 (or 'all') demands the kernel and raises if it cannot run;
  2. built     -- the build has a kernel for the tensor's device and this op registers one for it (the CPU
                  kernels are always built);
  3. supported -- the op's own check of this call (shape, dtype) passes.
A fallback is logged once per (op, reason) on the 'dsv4ops' logger and counted (fallback_counts()). Eager calls read
the environment variables and the device's arch every time, and ask the op registry once per op and device (again
after forget_decisions()).
explain(op, device) returns the decision with its trail without running anything.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
from typing import Callable, Optional

import torch

from . import platform

logger = logging.getLogger("dsv4ops")

KERNEL = "kernel"
REFERENCE = "reference"

_fallbacks: collections.Counter = collections.Counter()
_logged: set = set()
# ROCm builds register their kernels under the CUDA key too. Every op has a CPU kernel: the CPU query always
# passes, and keeps the CPU tests on the decision path GPU calls take (torch.compile included).
_DISPATCH_KEYS = {"cuda": "CUDA", "cpu": "CPU"}


# A fact of the build, taken as a constant by torch.compile (which cannot trace the query) and not re-checked in a
# compiled graph, nor (see _decided) by later eager calls: a registration made after the op's first call takes
# effect after forget_decisions() (and, in a compiled graph, from the next compile).
@torch.compiler.assume_constant_result
def _has_kernel(op: str, key: str) -> bool:
    """Whether the op has a kernel registered for the dispatch key (an op without a GPU kernel in this
    build registers the CPU one only)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"dsv4::{op}", key)


@dataclasses.dataclass(frozen=True)
class Decision:
    op: str
    device: str
    arch: str
    path: str  # KERNEL or REFERENCE
    reason: Optional[str]  # why the reference was chosen; None for the kernel
    trail: tuple  # one line per step

    @property
    def uses_kernel(self) -> bool:
        return self.path == KERNEL


def _names(value: str) -> set:
    return {part.strip() for part in value.split(",") if part.strip()}


def _env_ops(name: str) -> set:
    return _names(os.environ.get(name, ""))


def _named(op: str, names: set) -> bool:
    return "all" in names or op in names


def disabled(op: str) -> bool:
    """Whether DSV4OPS_DISABLE sends `op` to the reference."""
    return _named(op, _env_ops("DSV4OPS_DISABLE"))


# Decisions before a call's own check, keyed by all they depend on but the op registry (a fact of the build): an
# eager decode-sized call spent more time deciding its path than launching its kernel. Filled by eager calls only
# (a dict that a compiled graph reads would be guarded on, and each new entry would recompile it).
_decided: dict = {}


def _refuse(op: str, device: torch.device, arch: str, reason: str, trail: list, forced: bool,
            raise_if_forced: bool) -> Decision:
    if forced and not raise_if_forced:
        trail.append(f"-> a call raises (forced by DSV4OPS_FORCE): {reason}")
        return Decision(op, str(device), arch, REFERENCE, reason, tuple(trail))
    if forced:
        built = ", ".join(platform.BUILD_INFO["gpu_archs"]) or "none (CPU-only build)"
        raise RuntimeError(
            f"dsv4ops: {op} is forced by DSV4OPS_FORCE but its kernel cannot run on {device} ({arch}): "
            f"{reason}. This build ({platform.BUILD_INFO['backend']}) has GPU archs: {built}. "
            f"Rebuild with: {platform.rebuild_command(arch)}"
        )
    trail.append(f"-> reference: {reason}")
    return Decision(op, str(device), arch, REFERENCE, reason, tuple(trail))


def _decide_for_any_call(op: str, device: torch.device, arch: str, built: Optional[str], disable: str, force: str,
                         raise_if_forced: bool) -> Decision:
    """The reference's decision if the op cannot run here whatever the call; else the kernel's, its trail ending
    with the two lines of a passed check ('supported: yes', '-> kernel')."""
    trail = []
    forced = _named(op, _names(force))
    if _named(op, _names(disable)) and not forced:
        trail.append("selected: no (DSV4OPS_DISABLE)")
        return _refuse(op, device, arch, "disabled by DSV4OPS_DISABLE", trail, forced, raise_if_forced)
    trail.append("selected: yes" + (" (forced by DSV4OPS_FORCE)" if forced else ""))
    if built is None:
        trail.append(f"built: no kernel for {arch}")
        reason = (f"no kernel built for {arch} (backend {platform.BUILD_INFO['backend']}, "
                  f"archs {platform.BUILD_INFO['gpu_archs'] or 'none'})")
        return _refuse(op, device, arch, reason, trail, forced, raise_if_forced)
    key = _DISPATCH_KEYS.get(device.type)
    if key is not None and not _has_kernel(op, key):
        trail.append(f"built: no {key} kernel for {op}")
        return _refuse(op, device, arch, f"this build registers no {key} kernel for {op}", trail, forced,
                       raise_if_forced)
    trail += [f"built: yes ({built})", "supported: yes", "-> kernel"]
    return Decision(op, str(device), arch, KERNEL, None, tuple(trail))


def decide(op: str, device, supported: Optional[Callable[[], Optional[str]]] = None,
           raise_if_forced: bool = True) -> Decision:
    """Decide the path for `op` on `device`; `supported()` returns None or the reason it cannot run. An op that
    DSV4OPS_FORCE demands and whose kernel cannot run raises, unless raise_if_forced is False (explain): then the
    decision is the reference, its trail saying that a call would raise."""
    device = torch.device(device)
    arch = platform.device_arch(device)
    built = platform.built_arch_for(arch)
    disable, force = os.environ.get("DSV4OPS_DISABLE", ""), os.environ.get("DSV4OPS_FORCE", "")
    key = (op, device, arch, built, disable, force, raise_if_forced)
    compiling = torch.compiler.is_compiling()
    decision = None if compiling else _decided.get(key)
    if decision is None:
        decision = _decide_for_any_call(op, device, arch, built, disable, force, raise_if_forced)
        if not compiling:
            _decided[key] = decision
    if not decision.uses_kernel or supported is None:
        return decision
    reason = supported()
    if reason is None:
        return decision
    trail = list(decision.trail[:-2]) + [f"supported: no ({reason})"]
    return _refuse(op, device, arch, reason, trail, _named(op, _names(force)), raise_if_forced)


def log_once(key, level: int, message: str, *args) -> None:
    """logger.log(level, message, *args) the first time `key` (any hashable, named by its module) is seen since
    import or reset_fallbacks(): a model's layers repeat a call's reason many times."""
    if torch.compiler.is_compiling():
        return  # torch.compile cannot trace a logger call; the key stays unseen, for the next eager call
    if key not in _logged:
        _logged.add(key)
        logger.log(level, message, *args)


def record_fallback(op: str, arch: str, reason: str, served_by: str = REFERENCE, passed_over: str = "") -> None:
    """Counts a call the kernel did not serve and logs it once per (op, served_by, reason). Calls served by
    the reference count under (op, reason), by another fallback under (op, f"{served_by}: {reason}").
    passed_over: why other fallbacks before this one did not serve it, added to the logged line."""
    if torch.compiler.is_compiling():
        # Neither counted nor logged inside a compiled graph: a counter the graph bumps is a value Dynamo
        # guards on, so every call would compile anew (and fullgraph fail at the recompile limit).
        return
    key = (op, reason if served_by == REFERENCE else f"{served_by}: {reason}")
    _fallbacks[key] += 1
    what = "the PyTorch reference" if served_by == REFERENCE else f"the {served_by}"
    log_once(key, logging.WARNING, "dsv4ops: %s on %s uses %s: %s%s", op, arch, what, reason,
             f"; {passed_over}" if passed_over else "")


def record(decision: Decision) -> Decision:
    """Counts and logs (once per op and reason) a fallback decision; returns the decision."""
    if not decision.uses_kernel:
        record_fallback(decision.op, decision.arch, decision.reason)
    return decision


def choose(op: str, device, supported: Optional[Callable[[], Optional[str]]] = None) -> Decision:
    return record(decide(op, device, supported))


def explain(op: str, device="cpu") -> Decision:
    """The decision (with its trail) for `op` on `device`, without running or logging anything (nor raising for
    an op that DSV4OPS_FORCE demands: its trail says that a call would raise)."""
    return decide(op, device, raise_if_forced=False)


def fallback_counts() -> dict:
    """{(op, reason): number of calls the kernel did not serve} since import or reset_fallbacks() (see
    record_fallback for the keys of calls served by another fallback than the reference)."""
    return dict(_fallbacks)


def reset_fallbacks() -> None:
    _fallbacks.clear()
    _logged.clear()


def forget_decisions() -> None:
    """Makes the next eager call of each op ask the op registry again (after a kernel is registered for a dsv4 op
    at run time). The environment variables, the device's arch and the build's archs are read on every call."""
    _decided.clear()
