"""dispatch (selected -> built -> supported, logging, forcing) and platform facts, with simulated archs."""

import logging
import warnings

import pytest
import torch

import dsv4ops
from dsv4ops import Fp8Format, dispatch, platform


@pytest.fixture
def simulate_arch(monkeypatch):
    def simulate(arch, built_archs=None, backend=None):
        monkeypatch.setattr(platform, "device_arch", lambda device: arch)
        if built_archs is not None:
            info = dict(platform.BUILD_INFO, gpu_archs=built_archs, backend=backend or "cuda")
            monkeypatch.setattr(platform, "BUILD_INFO", info)
    return simulate


@pytest.mark.parametrize(
    "arch,fmt,qmax,dtype",
    [("gfx942", Fp8Format.FNUZ, 224.0, torch.float8_e4m3fnuz), ("gfx950", Fp8Format.OCP, 448.0, torch.float8_e4m3fn),
     ("sm_90", Fp8Format.OCP, 448.0, torch.float8_e4m3fn), ("cpu", Fp8Format.OCP, 448.0, torch.float8_e4m3fn)],
)
def test_platform_facts_per_arch(simulate_arch, arch, fmt, qmax, dtype):
    simulate_arch(arch)
    assert platform.fp8_format("cpu") is fmt
    assert platform.quant_max("cpu") == qmax
    assert platform.fp8_dtype("cpu") == dtype


def test_real_cpu_device():
    assert dsv4ops.device_arch("cpu") == "cpu"
    assert dsv4ops.fp8_format(torch.device("cpu")) is Fp8Format.OCP


@pytest.mark.parametrize(
    "built,arch,expected",
    [(["sm_90a"], "sm_90", "sm_90a"), (["sm_90a"], "sm_89", None), (["sm_90"], "sm_90", "sm_90"),
     (["gfx942", "gfx950"], "gfx950", "gfx950"), (["gfx942"], "gfx950", None), ([], "sm_90", None),
     ([], "cpu", "cpu")],
)
def test_built_arch_for(monkeypatch, built, arch, expected):
    monkeypatch.setattr(platform, "BUILD_INFO", dict(platform.BUILD_INFO, gpu_archs=built))
    assert platform.built_arch_for(arch) == expected


def test_fp8_format_parse():
    assert Fp8Format.parse("fnuz") is Fp8Format.FNUZ
    assert Fp8Format.parse("OCP") is Fp8Format.OCP
    assert Fp8Format.parse(torch.float8_e4m3fnuz) is Fp8Format.FNUZ
    assert Fp8Format.parse(1) is Fp8Format.FNUZ
    for bad in ("e5m2", 2, True, torch.float8_e5m2, 1.0):
        with pytest.raises(ValueError, match="fp8_format"):
            Fp8Format.parse(bad)


def test_kernel_on_cpu_with_trail():
    decision = dsv4ops.explain("fp8_encode", "cpu")
    assert decision.uses_kernel and decision.reason is None
    assert decision.trail == ("selected: yes", "built: yes (cpu)", "supported: yes", "-> kernel")


def test_disable_sends_to_reference_logs_once_and_counts(monkeypatch, caplog):
    monkeypatch.setenv("DSV4OPS_DISABLE", "fp8_encode,ue8m0_to_float")
    x = torch.tensor([1000.0, -3.0])
    with caplog.at_level(logging.WARNING, logger="dsv4ops"):
        first = dsv4ops.fp8_encode(x)
        dsv4ops.fp8_encode(x)
        dsv4ops.ue8m0_to_float(torch.tensor([127], dtype=torch.uint8))
    assert first.float().tolist() == [448.0, -3.0]  # the reference gives the same answer
    messages = [r.getMessage() for r in caplog.records]
    assert sum("fp8_encode" in m for m in messages) == 1
    assert any("disabled by DSV4OPS_DISABLE" in m for m in messages)
    counts = dsv4ops.fallback_counts()
    assert counts[("fp8_encode", "disabled by DSV4OPS_DISABLE")] == 2
    assert counts[("ue8m0_to_float", "disabled by DSV4OPS_DISABLE")] == 1
    assert dsv4ops.explain("fp8_block_dequantize").uses_kernel


def test_disable_all(monkeypatch):
    monkeypatch.setenv("DSV4OPS_DISABLE", "all")
    assert not dsv4ops.explain("e4m3fn_to_fnuz").uses_kernel


def test_unbuilt_arch_falls_back_with_reason(simulate_arch):
    simulate_arch("gfx942", built_archs=["sm_90a"])
    decision = dsv4ops.explain("fp8_block_dequantize", "cpu")
    assert not decision.uses_kernel
    assert "no kernel built for gfx942" in decision.reason
    assert decision.trail[-1].startswith("-> reference")


def test_force_unbuilt_arch_raises_with_rebuild_command(simulate_arch, monkeypatch):
    simulate_arch("gfx942", built_archs=["sm_90a"])
    monkeypatch.setenv("DSV4OPS_FORCE", "fp8_encode")
    with pytest.raises(RuntimeError) as error:
        dsv4ops.fp8_encode(torch.zeros(2))
    message = str(error.value)
    assert "gfx942" in message and "sm_90a" in message
    assert "DSV4OPS_BACKEND=rocm DSV4OPS_GPU_ARCHS=gfx942 pip install --no-build-isolation ." in message
    # explain (and the info CLI, which calls it for every op) reports the decision instead of raising
    decision = dsv4ops.explain("fp8_encode")
    assert not decision.uses_kernel and "no kernel built for gfx942" in decision.reason
    assert decision.trail[-1].startswith("-> a call raises (forced by DSV4OPS_FORCE)")


def test_force_beats_disable_and_unsupported_raises(monkeypatch):
    monkeypatch.setenv("DSV4OPS_DISABLE", "all")
    monkeypatch.setenv("DSV4OPS_FORCE", "fp8_encode")
    assert dsv4ops.explain("fp8_encode").uses_kernel
    with pytest.raises(RuntimeError, match="input dtype torch.float16"):
        dsv4ops.fp8_encode(torch.zeros(2, dtype=torch.float16))


def test_eager_decisions_follow_the_environment_the_arch_and_the_call(simulate_arch, monkeypatch):
    """Eager decisions are kept between calls (an eager decode call spent more time deciding than launching);
    the environment variables and the device's arch are read on every call, and each call's own check runs."""
    assert dispatch.decide("fp8_encode", "cpu").uses_kernel
    monkeypatch.setenv("DSV4OPS_DISABLE", "fp8_encode")
    assert dispatch.decide("fp8_encode", "cpu").reason == "disabled by DSV4OPS_DISABLE"
    monkeypatch.setenv("DSV4OPS_FORCE", "fp8_encode")
    refused = dispatch.decide("fp8_encode", "cpu", lambda: "too big", raise_if_forced=False)
    assert refused.trail == ("selected: yes (forced by DSV4OPS_FORCE)", "built: yes (cpu)", "supported: no (too big)",
                             "-> a call raises (forced by DSV4OPS_FORCE): too big")
    with pytest.raises(RuntimeError, match="forced by DSV4OPS_FORCE but its kernel cannot run on cpu"):
        dispatch.decide("fp8_encode", "cpu", lambda: "too big")
    monkeypatch.delenv("DSV4OPS_FORCE")
    monkeypatch.delenv("DSV4OPS_DISABLE")
    unsupported = dispatch.decide("fp8_encode", "cpu", lambda: "too big")
    assert unsupported.reason == "too big"
    assert unsupported.trail == ("selected: yes", "built: yes (cpu)", "supported: no (too big)",
                                 "-> reference: too big")
    assert dispatch.decide("fp8_encode", "cpu", lambda: None) == dispatch.decide("fp8_encode", "cpu")
    assert dispatch.decide("fp8_encode", "cpu").trail == ("selected: yes", "built: yes (cpu)", "supported: yes",
                                                          "-> kernel")
    simulate_arch("gfx942", built_archs=["sm_90a"])
    assert "no kernel built for gfx942" in dispatch.decide("fp8_encode", "cpu").reason
    simulate_arch("gfx942", built_archs=["gfx942"])
    assert dispatch.decide("fp8_encode", "cpu").trail[1] == "built: yes (gfx942)"


def test_the_op_registry_is_asked_once_until_decisions_are_forgotten(monkeypatch):
    """Whether an op registers a kernel for the device's dispatch key is asked once per op and device, and again
    after forget_decisions() (for a kernel registered at run time)."""
    asked = []
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key",
                        lambda name, key, query=torch._C._dispatch_has_kernel_for_dispatch_key: asked.append(name)
                        or query(name, key))
    for _ in range(3):
        assert dispatch.decide("inverse_rope", "cpu").uses_kernel
    assert dispatch.decide("fp8_encode", "cpu").uses_kernel
    assert asked == ["dsv4::inverse_rope", "dsv4::fp8_encode"]
    dispatch.forget_decisions()
    assert dispatch.decide("inverse_rope", "cpu").uses_kernel
    assert asked == ["dsv4::inverse_rope", "dsv4::fp8_encode", "dsv4::inverse_rope"]


def test_a_compiled_fallback_does_not_recompile_per_call(monkeypatch):
    """The fallback counter is not bumped inside a compiled graph: Dynamo guards on the counter's value, so each
    call compiled anew (and fullgraph failed at the recompile limit, on the ninth call)."""
    monkeypatch.setenv("DSV4OPS_DISABLE", "inverse_rope")
    o = torch.randn(3, 2, 512).to(torch.bfloat16)
    positions, cos_sin = torch.arange(3), torch.randn(8, 64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda o_: dsv4ops.inverse_rope(o_, positions, cos_sin), fullgraph=True)
    expected = torch.ops.dsv4.inverse_rope(o, positions, cos_sin)
    assert torch.equal(compiled(o), expected)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            assert torch.equal(compiled(o), expected)
    torch._dynamo.reset()


def test_a_data_dependent_reference_compiles_with_a_graph_break(monkeypatch):
    """The references that loop over data (here the top-k's) cannot be traced with fullgraph; compiled without
    it, a call that falls back to one breaks the graph there and gives the eager result (README)."""
    monkeypatch.setenv("DSV4OPS_DISABLE", "topk_per_row_prefill")
    logits = torch.randn(4, 300)
    ks, ke = torch.tensor([0, 5, -2, 290], dtype=torch.int32), torch.tensor([300, 200, 40, 400], dtype=torch.int32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda l_: dsv4ops.topk_per_row_prefill(l_ * 2, ks, ke, 16))
    assert torch.equal(compiled(logits), dsv4ops.topk_per_row_prefill(logits * 2, ks, ke, 16))
    torch._dynamo.reset()


def test_force_refusal_under_compile_names_the_reason(monkeypatch):
    """A forced kernel that cannot serve the call raises while tracing; with fullgraph=True torch.compile reports
    it as its own error, which must still carry dsv4ops' message (without fullgraph the eager call raises it)."""
    monkeypatch.setenv("DSV4OPS_FORCE", "fp8_encode")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: dsv4ops.fp8_encode(x), fullgraph=True)
    with pytest.raises(RuntimeError, match="fp8_encode is forced by DSV4OPS_FORCE but its kernel cannot run"):
        compiled(torch.zeros(2, dtype=torch.float16))
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="fp8_encode is forced by DSV4OPS_FORCE but its kernel cannot run"):
        torch.compile(lambda x: dsv4ops.fp8_encode(x))(torch.zeros(2, dtype=torch.float16))
    torch._dynamo.reset()


def test_wrappers_compile_fullgraph_through_the_kernel_registry_query(monkeypatch):
    """The dispatch decision asks the op registry whether a kernel is registered for the device's dispatch key:
    torch.compile cannot trace that query, so it is taken as a constant of the build (every wrapper failed to
    compile with fullgraph on CUDA before). The CPU takes the same path."""
    asked = []
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key",
                        lambda name, key, query=torch._C._dispatch_has_kernel_for_dispatch_key: asked.append(key)
                        or query(name, key))
    assert dispatch.decide("inverse_rope", "cpu").uses_kernel and asked == ["CPU"]
    o = torch.randn(3, 2, 512).to(torch.bfloat16)
    positions, cos_sin = torch.arange(3), torch.randn(8, 64)
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())  # Dynamo warns once per process
    compiled = torch.compile(lambda o_: dsv4ops.inverse_rope(o_, positions, cos_sin), fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(compiled(o), torch.ops.dsv4.inverse_rope(o, positions, cos_sin))
    # The device's arch is a trace-time constant too (Dynamo warned on the lru_cache it was once held in).
    assert not [w for w in caught if "dsv4ops" in str(w.message) or "platform.py" in str(w.message)]


def test_a_fallback_decided_under_compile_is_not_logged_there(caplog):
    """torch.compile cannot trace a logger call: a wrapper that falls back compiles with fullgraph, and the
    fallback is logged by the next eager call (not lost)."""
    caplog.set_level(logging.INFO, logger="dsv4ops")
    o = torch.randn(3, 2, 512).to(torch.bfloat16)
    positions, cos_sin = torch.arange(3), torch.randn(8, 64)
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DSV4OPS_DISABLE", "inverse_rope")
        compiled = torch.compile(lambda o_: dsv4ops.inverse_rope(o_, positions, cos_sin), fullgraph=True)
        assert torch.equal(compiled(o), torch.ops.dsv4.inverse_rope(o, positions, cos_sin))
        assert "inverse_rope" not in caplog.text
        dsv4ops.inverse_rope(o, positions, cos_sin)
    assert "dsv4ops: inverse_rope on cpu uses the PyTorch reference: disabled by DSV4OPS_DISABLE" in caplog.text
    torch._dynamo.reset()
