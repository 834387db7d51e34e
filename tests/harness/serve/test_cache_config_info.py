"""The served reference exports vLLM's ``vllm:cache_config_info``: its KV cache's size, which
`batchlab calibrate` and `validate` read as they read vLLM's."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from adapters.reference.config import ReferenceConfig
from harness.calibrate import KvCacheInfo, kv_cache_from_metrics
from harness.serve.app import start_server_in_thread


def test_cache_config_info_carries_the_kv_cache_as_vllm_does() -> None:
    config = ReferenceConfig(model="llama-3.1-8b", max_num_seqs=8, max_num_batched_tokens=2048,
                             max_model_len=2048, num_gpu_blocks=160)
    with start_server_in_thread(config) as server:
        text = httpx.get(server.url + "/metrics", trust_env=False).text
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "vllm:cache_config_info"]
    assert family.type == "gauge"
    (sample,) = family.samples
    assert sample.value == 1.0
    labels = sample.labels
    assert labels["num_gpu_blocks"] == "160" and labels["block_size"] == "16"
    assert labels["engine"] == "0" and labels["cache_dtype"] == "auto"
    assert labels["enable_prefix_caching"] == "False"
    assert labels["gpu_memory_utilization"] == "0.9"
    assert kv_cache_from_metrics(text) == KvCacheInfo(block_size=16, num_blocks=160)
    # a malformed line of another exporter's family does not hide the cache's size
    broken = text + 'some_exporter_metric{bad-label="x"} 1\n'
    assert kv_cache_from_metrics(broken) == KvCacheInfo(block_size=16, num_blocks=160)
