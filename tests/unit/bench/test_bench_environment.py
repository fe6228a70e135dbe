"""The machine section of every result names the CPU and the ISA flags that pick kernels."""

from __future__ import annotations

from tritonforge.bench.environment import ISA_FLAGS, Machine, describe_machine, parse_cpuinfo

# Two processors of one Sapphire Rapids host, flags cut to the interesting part.
INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
AMD = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_an_amx_host_has_every_flag() -> None:
    model, isa = parse_cpuinfo(INTEL)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert isa == dict.fromkeys(ISA_FLAGS, True)


def test_an_avx2_host_records_the_others_as_absent() -> None:
    model, isa = parse_cpuinfo(AMD)
    assert model == "AMD EPYC 7B13"
    assert isa["avx2"] is True
    assert not any(isa[flag] for flag in ISA_FLAGS if flag != "avx2")
    assert set(isa) == set(ISA_FLAGS)


def test_the_report_line_names_present_and_absent_flags() -> None:
    _, isa = parse_cpuinfo(AMD)
    machine = Machine(
        cpu_model="AMD EPYC 7B13", cores=2, ram_gib=23.5, os="Linux", python="3.11", isa_flags=isa
    )
    line = describe_machine(machine)
    assert line.startswith("AMD EPYC 7B13, 2 cores, 23.5 GiB RAM, Linux")
    assert "present: avx2;" in line and "absent: avx512f, avx512_bf16" in line


def test_results_from_before_the_flags_still_load_and_say_so() -> None:
    old = Machine.model_validate(
        {"cpu_model": "AMD EPYC", "cores": 2, "ram_gib": 23.5, "os": "Linux", "python": "3.11"}
    )
    assert old.isa_flags == {}
    assert describe_machine(old).endswith("ISA flags not recorded")
