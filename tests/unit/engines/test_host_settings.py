"""The host-dependent vLLM settings: CPU flags → dtype/binding, explicit values win, log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonforge.engines.host_settings import (
    ALL_BUT_ONE,
    BIND_ENV,
    BIND_KEY,
    KV_BYTES_KEY,
    KV_SPACE_ENV,
    Host,
    cpu_flags,
    cpu_list,
    other_dtype,
    read_host,
    resolve_host_settings,
)

AVX2 = Host(cpu=True, flags=frozenset({"avx2", "fma"}), cores=(0, 1))
AMX = Host(cpu=True, flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}), cores=(0, 1))
GPU = Host(cpu=False, flags=frozenset({"avx2"}), cores=(0, 1, 2, 3))
SHIPPED = {"model": "/m", "dtype": "auto", "max_model_len": 2048}


def test_auto_dtype_is_float32_on_a_cpu_without_bf16_instructions() -> None:
    resolved = resolve_host_settings(SHIPPED, AVX2, {})
    assert resolved.engine["dtype"] == "float32"
    assert "without avx512_bf16/amx_bf16" in resolved.reasons[0]


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_auto_dtype_stays_vllms_choice_where_bf16_is_native(flag: str) -> None:
    host = Host(cpu=True, flags=frozenset({"avx2", flag}), cores=(0,))
    resolved = resolve_host_settings(SHIPPED, host, {})
    assert resolved.engine["dtype"] == "auto"
    assert flag in resolved.reasons[0]


def test_auto_dtype_stays_vllms_choice_off_the_cpu() -> None:
    assert resolve_host_settings(SHIPPED, GPU, {}).engine["dtype"] == "auto"


def test_a_missing_dtype_is_auto() -> None:
    resolved = resolve_host_settings({"model": "/m"}, AVX2, {})
    assert resolved.engine["dtype"] == "float32"


@pytest.mark.parametrize("host", [AVX2, AMX, GPU])
def test_an_explicit_dtype_always_wins(host: Host) -> None:
    resolved = resolve_host_settings({**SHIPPED, "dtype": "bfloat16"}, host, {})
    assert resolved.engine["dtype"] == "bfloat16"
    assert resolved.reasons[0] == "engine setting dtype=bfloat16: set in model.json"


def test_binding_takes_every_core_the_process_may_use() -> None:
    host = Host(cpu=True, flags=frozenset(), cores=(2, 3, 4, 7, 9))
    resolved = resolve_host_settings(SHIPPED, host, {})
    assert resolved.env == {BIND_ENV: "2-4,7,9"}
    assert resolved.reasons[1].startswith(f"engine setting {BIND_ENV}=2-4,7,9: every core")
    assert "EngineCore" in resolved.reasons[1]
    assert resolve_host_settings(SHIPPED, AVX2, {}).env == {BIND_ENV: "0-1"}


def test_a_single_core_is_the_workers() -> None:
    host = Host(cpu=True, flags=frozenset(), cores=(3,))
    assert resolve_host_settings(SHIPPED, host, {}).env == {BIND_ENV: "3"}


def test_all_but_one_in_model_json_leaves_the_last_core() -> None:
    host = Host(cpu=True, flags=frozenset(), cores=(2, 3, 4, 7, 9))
    resolved = resolve_host_settings({**SHIPPED, BIND_KEY: ALL_BUT_ONE}, host, {})
    assert resolved.env == {BIND_ENV: "2-4,7"}
    assert resolved.reasons[1].endswith(f"{BIND_KEY} {ALL_BUT_ONE} in model.json")
    one_core = Host(cpu=True, flags=frozenset(), cores=(3,))
    assert resolve_host_settings({BIND_KEY: ALL_BUT_ONE}, one_core, {}).env == {BIND_ENV: "3"}


def test_all_in_model_json_binds_every_core() -> None:
    resolved = resolve_host_settings({**SHIPPED, BIND_KEY: "all"}, AVX2, {})
    assert resolved.env == {BIND_ENV: "0-1"}
    assert "every core" in resolved.reasons[1]


def test_an_explicit_binding_variable_wins_and_is_left_alone() -> None:
    resolved = resolve_host_settings({**SHIPPED, BIND_KEY: "0"}, AVX2, {BIND_ENV: "auto"})
    assert resolved.env == {}
    assert resolved.reasons[1] == f"engine setting {BIND_ENV}=auto: set in the environment"


def test_a_model_json_binding_wins_over_the_host_and_is_not_an_engine_argument() -> None:
    resolved = resolve_host_settings({**SHIPPED, BIND_KEY: "auto"}, AVX2, {})
    assert resolved.env == {BIND_ENV: "auto"}
    assert BIND_KEY not in resolved.engine
    assert resolved.reasons[1].endswith(f"{BIND_KEY} set in model.json")


@pytest.mark.parametrize("value", ["", 1, None])
def test_a_malformed_model_json_binding_names_the_key_and_the_rule(value: object) -> None:
    with pytest.raises(ValueError, match=f"{BIND_KEY} must be a non-empty string"):
        resolve_host_settings({**SHIPPED, BIND_KEY: value}, AVX2, {})


def test_no_binding_off_the_cpu() -> None:
    assert resolve_host_settings(SHIPPED, GPU, {}).env == {}


def test_eager_on_cpu_unless_model_json_says_otherwise() -> None:
    assert resolve_host_settings(SHIPPED, AVX2, {}).engine["enforce_eager"] is True
    explicit = resolve_host_settings({**SHIPPED, "enforce_eager": False}, AVX2, {})
    assert explicit.engine["enforce_eager"] is False
    assert explicit.reasons[2] == "engine setting enforce_eager=False: set in model.json"
    assert "enforce_eager" not in resolve_host_settings(SHIPPED, GPU, {}).engine


def test_other_settings_pass_through_and_the_input_is_not_changed() -> None:
    settings = {**SHIPPED, BIND_KEY: "0-1"}
    resolved = resolve_host_settings(settings, AVX2, {})
    assert resolved.engine["max_model_len"] == 2048 and resolved.engine["model"] == "/m"
    assert settings[BIND_KEY] == "0-1" and settings["dtype"] == "auto"


@pytest.mark.parametrize("host", [AVX2, AMX, GPU])
def test_one_log_line_per_choice_saying_what_and_why(host: Host) -> None:
    reasons = resolve_host_settings(SHIPPED, host, {}).reasons
    assert [line.split("=")[0] for line in reasons] == [
        "engine setting dtype",
        f"engine setting {BIND_ENV}",
        "engine setting enforce_eager",
    ]
    for line in reasons:
        what, _, why = line.partition(": ")
        assert "\n" not in line and what and why


def test_cpu_flags_and_lists_are_read_from_proc_cpuinfo_text(tmp_path: Path) -> None:
    text = "processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert cpu_flags(text) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags("processor: 0\n") == frozenset()
    assert cpu_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    (tmp_path / "cpuinfo").write_text(text)
    host = read_host(cpu=True, cpuinfo=tmp_path / "cpuinfo")
    assert "amx_bf16" in host.flags and host.cores
    assert read_host(cpu=True, cpuinfo=tmp_path / "missing").flags == frozenset()


def test_the_numerics_rerun_serves_the_dtype_this_host_does_not() -> None:
    assert other_dtype(SHIPPED, AVX2) == "bfloat16"
    assert other_dtype(SHIPPED, AMX) == "float32"
    assert other_dtype({**SHIPPED, "dtype": "float32"}, AMX) == "bfloat16"
    assert other_dtype({**SHIPPED, "dtype": "bfloat16"}, AVX2) == "float32"


def test_a_model_json_kv_cache_size_clears_the_variable_that_would_override_it() -> None:
    env = {KV_SPACE_ENV: "1"}
    resolved = resolve_host_settings({**SHIPPED, KV_BYTES_KEY: 268435456}, AVX2, env)
    assert resolved.unset == (KV_SPACE_ENV,)
    assert resolved.reasons[-1].endswith(f"{KV_BYTES_KEY} set in model.json")
    resolved.apply(env)
    assert KV_SPACE_ENV not in env
    assert env[BIND_ENV] == "0-1"


def test_without_a_kv_cache_size_the_variable_stays() -> None:
    settings = {k: v for k, v in SHIPPED.items() if k != KV_BYTES_KEY}
    assert resolve_host_settings(settings, AVX2, {KV_SPACE_ENV: "1"}).unset == ()
    assert resolve_host_settings({**SHIPPED, KV_BYTES_KEY: 1}, GPU, {KV_SPACE_ENV: "1"}).unset == ()
