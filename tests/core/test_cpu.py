"""The REC_MAX_CPU_ISA seam: rec sees a smaller CPU than it runs on, so the refusals and
fallbacks of an AVX2-only or non-AMX CPU run on every CPU kind."""

import pytest

from rec import cpu


@pytest.fixture
def flags(monkeypatch):
    """A CPU with every kernel flag (an Intel Xeon with AMX), whatever this machine is."""
    every = ["fpu", "sse4_2", "avx", "f16c", *cpu.KERNEL_FLAGS]
    monkeypatch.setattr(cpu, "_read_cpuinfo", lambda: ("Test CPU", every))
    return every


@pytest.mark.parametrize(
    ("cap", "hidden"),
    [
        (None, set()),
        ("avx512", {"amx_tile", "amx_bf16", "amx_int8"}),
        ("avx2", {"amx_tile", "amx_bf16", "amx_int8", "avx512f", "avx512bw", "avx512_vnni",
                  "avx512_bf16"}),
        ("scalar", {"amx_tile", "amx_bf16", "amx_int8", "avx512f", "avx512bw", "avx512_vnni",
                    "avx512_bf16", "avx", "avx2", "fma", "f16c", "avx_vnni"}),
    ],
)  # fmt: skip
def test_a_cap_hides_exactly_what_is_above_it(flags, monkeypatch, cap, hidden):
    if cap:
        monkeypatch.setenv(cpu.CAP_ENV, cap)
    else:
        monkeypatch.delenv(cpu.CAP_ENV, raising=False)
    assert set(flags) - set(cpu.all_flags()) == hidden
    info = cpu.cpu_info()
    assert set(info["flags"]) == set(cpu.KERNEL_FLAGS) - hidden
    assert cpu.has_amx() == (cap is None)
    assert ("held to" in cpu.describe(info)) == (cap is not None)


def test_bf16_is_absent_below_avx512(monkeypatch):
    monkeypatch.setenv(cpu.CAP_ENV, "avx2")
    assert cpu.bf16_inner_product() is False
    monkeypatch.setenv(cpu.CAP_ENV, "scalar")
    assert cpu.bf16_inner_product() is False


def test_an_unknown_cap_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(cpu.CAP_ENV, "avx1024")
    with pytest.raises(ValueError, match=r"REC_MAX_CPU_ISA='avx1024': expected one of avx512"):
        cpu.all_flags()
