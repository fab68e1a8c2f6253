"""host.refusals: the host's own configuration checks, said in one line with the settings they read, on the installed
megatron-core (its real TransformerConfig raising)."""

from __future__ import annotations

import pytest

from bridge_cudagraph.host.refusals import host_refusal_line


def _refusal(**fields) -> BaseException:
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises((AssertionError, ValueError)) as caught:
        TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **fields)
    return caught.value


def test_a_bare_assertion_gets_its_condition_and_the_setting_it_reads():
    error = _refusal(fine_grained_activation_offloading=True)
    assert str(error) == ""  # what the CLI printed: "error: AssertionError"
    line = host_refusal_line(error)
    assert line is not None and line.startswith("megatron-core's TransformerConfig.__post_init__ refused")
    assert "assert self.offload_modules is not None and len(self.offload_modules) > 0" in line
    assert "megatron/core/transformer/transformer_config.py:" in line
    assert line.endswith("the check reads model.offload_modules: change it")


def test_a_message_that_names_no_setting_gets_the_settings_of_the_if_around_the_raise():
    error = _refusal(cpu_offloading=True, cpu_offloading_num_layers=1, cuda_graph_impl="transformer_engine")
    line = host_refusal_line(error)
    assert line is not None and "CUDA graphs not supported with CPU offloading." in line
    assert "the check reads model.cpu_offloading, model.cuda_graph_impl" in line


def test_a_message_that_names_its_settings_is_kept_as_it_is():
    error = _refusal(fine_grained_activation_offloading=True, offload_modules=["core_attn"], cpu_offloading=True)
    line = host_refusal_line(error)
    assert line is not None and "fine_grained_activation_offloading cannot be enabled with cpu_offloading." in line
    assert "the check reads" not in line  # its message names cpu_offloading already


def test_an_error_raised_outside_the_host_is_not_the_hosts():
    try:
        raise ValueError("ours")
    except ValueError as error:
        assert host_refusal_line(error) is None
