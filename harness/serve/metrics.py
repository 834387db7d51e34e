"""The served engine's Prometheus metrics: vLLM's names, TGI's queue and batch gauges."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest

from harness.serve.loop import EngineObserver, ServedEngine, TokenStream

# vLLM's bucket edges (vllm/v1/metrics/loggers.py).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)


class PrometheusMetrics(EngineObserver):
    """vLLM's metric names (labels ``model_name`` and ``engine="0"``) plus TGI's queue and batch
    gauges, in a private registry. Gauges read the engine when scraped."""

    def __init__(self, engine: ServedEngine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        names = ("model_name", "engine")
        labels = {"model_name": model_name, "engine": "0"}
        blocks = engine.core.blocks
        block_size = engine.config.block_size
        num_blocks = engine.core.num_kv_blocks_total

        def gauge(name: str, doc: str, read: Callable[[], float], labelled: bool = True) -> None:
            if labelled:
                Gauge(name, doc, names, registry=r).labels(**labels).set_function(read)
            else:
                Gauge(name, doc, registry=r).set_function(read)

        gauge("vllm:num_requests_running", "Requests in the running batch.",
              lambda: engine.num_running)
        gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
              lambda: engine.num_waiting)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.",
              lambda: blocks.num_used_blocks / num_blocks)
        gauge("tgi_queue_size", "Requests waiting to be scheduled (TGI's name).",
              lambda: engine.num_waiting, labelled=False)
        gauge("tgi_batch_current_size", "Requests in the running batch (TGI's name).",
              lambda: engine.num_running, labelled=False)
        gauge("tgi_batch_current_max_tokens", "KV-cache tokens held by the batch (TGI's name).",
              lambda: blocks.num_used_blocks * block_size, labelled=False)
        gauge("tgi_batch_max_total_tokens", "KV-cache capacity in tokens (TGI's name).",
              lambda: num_blocks * block_size, labelled=False)

        # vLLM's cache configuration: an info gauge of value 1 whose labels are the config
        # (engines.md 4.2, "vllm:cache_config_info"; vllm/v1/metrics/loggers.py
        # ``log_metrics_info``: every ``CacheConfig.metrics_info()`` field str()-ed, plus
        # ``engine``). `batchlab calibrate` and `validate` read the KV cache's size from it.
        # The fields the reference has, under vLLM's names; ``model_name`` as on every vllm:
        # series here (vLLM's own info gauge has none).
        config = engine.config
        config_labels = {
            "block_size": str(block_size),
            "cache_dtype": "fp8" if config.kv_cache_dtype == "fp8" else "auto",
            "enable_prefix_caching": str(bool(config.prefix_caching)),
            "gpu_memory_utilization": str(config.gpu_memory_utilization),
            "num_cpu_blocks": str(config.num_host_blocks()) if config.preemption == "swap"
            else "None",
            "num_gpu_blocks": str(num_blocks),
            "num_gpu_blocks_override": "None" if config.num_gpu_blocks is None
            else str(config.num_gpu_blocks),
            **labels,
        }
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              sorted(config_labels), registry=r).labels(**config_labels).set(1)

        # exported with caching off too, at 0, as vLLM's logger creates them whatever its
        # configuration: a dashboard finds the series
        r.register(_PrefixCacheCollector(engine, labels))
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", names,
                                   registry=r).labels(**labels)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens.", names,
                                     registry=r).labels(**labels)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", names,
                                         registry=r).labels(**labels)
        # A series per finish reason from the start, zero until used, as vLLM's
        # PrometheusStatLogger does (vllm-project/vllm, vllm/v1/metrics/loggers.py, commit
        # 005a810bc40faa25b8870fbc8559c3462581eee3, read 2026-11-30): "length" (every request
        # runs to its max_tokens) and "abort" (its client went away).
        success = Counter("vllm:request_success", "Finished requests.",
                          (*names, "finished_reason"), registry=r)
        self.success_length = success.labels(**labels, finished_reason="length")
        self.success_abort = success.labels(**labels, finished_reason="abort")
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Tokens scheduled per engine step (vLLM counts a prompt at the step that finishes "
            "it, plus the tokens generated).", names,
            buckets=ITERATION_TOKEN_BUCKETS, registry=r).labels(**labels)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Receipt to first token, engine clock.", names,
            buckets=TTFT_BUCKETS, registry=r).labels(**labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Receipt to last token, engine clock.", names,
            buckets=REQUEST_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Arrival at the engine (receipt + front end) to first scheduled step.", names,
            buckets=REQUEST_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.lateness = Histogram(
            "batchlab_reference_step_lateness_seconds",
            "How long after its predicted end instant a step's tokens were released.",
            buckets=LATENESS_BUCKETS, registry=r)

    def on_step(self, num_tokens: int, num_preemptions: int) -> None:
        self.iteration_tokens.observe(num_tokens)
        if num_preemptions:
            self.preemptions.inc(num_preemptions)

    def on_first_token(self, stream: TokenStream, at_s: float) -> None:
        # TTFT and E2E from the server's receipt, so they include the modelled front end (as
        # simulate's do); the queue time from the arrival at the engine, after it.
        request = stream.request
        self.prompt_tokens.inc(request.num_prompt_tokens)
        self.ttft.observe(max(0.0, at_s - stream.received_s))
        if request.first_scheduled_s is not None:
            self.queue_time.observe(max(0.0, request.first_scheduled_s - request.arrival_s))

    def on_tokens(self, num_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)

    def on_finished(self, stream: TokenStream) -> None:
        self.success_length.inc()
        finished_s = stream.request.finished_s
        if finished_s is not None:
            self.e2e.observe(max(0.0, finished_s - stream.received_s))

    def on_aborted(self, stream: TokenStream) -> None:
        self.success_abort.inc()

    def on_lateness(self, lateness_s: float) -> None:
        self.lateness.observe(max(0.0, lateness_s))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _PrefixCacheCollector:
    """``vllm:prefix_cache_queries`` and ``_hits`` (prompt tokens looked up at admission and
    found), read from the block manager when scraped."""

    def __init__(self, engine: ServedEngine, labels: dict[str, str]) -> None:
        self.blocks = engine.core.blocks
        self.labels = labels

    def collect(self) -> Iterator[CounterMetricFamily]:
        names = list(self.labels)
        for name, doc, value in (
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             self.blocks.prefix_cache_queries_tokens),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             self.blocks.prefix_cache_hits_tokens),
        ):
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric([self.labels[n] for n in names], value)
            yield family
