"""The queries a vLLM user's dashboards and alerts run, written against vLLM's metric names and labels (the panels
of vLLM's example Grafana dashboard and its speculative-decoding figures): a check that this server's `vllm:`
families serve them unchanged (tests/deployments/test_prometheus.py runs each against a real Prometheus).

    from dashboards.vllm_queries import vllm_queries
    for title, promql in vllm_queries(model_name="my-model"):
        ...
"""
from __future__ import annotations

# $model_name and $__rate_interval are Grafana variables, as in vLLM's dashboard.
M = 'model_name="$model_name"'
R = "$__rate_interval"


def _quantiles(family: str, title: str) -> list[tuple[str, str]]:
    return [(f"{title} p{q}", f"histogram_quantile(0.{q}, sum by (le) (rate({family}_bucket{{{M}}}[{R}])))")
            for q in (99, 95, 90, 50)] + [
        (f"{title} average", f"rate({family}_sum{{{M}}}[{R}]) / rate({family}_count{{{M}}}[{R}])")]


QUERIES: list[tuple[str, str]] = [
    *_quantiles("vllm:e2e_request_latency_seconds", "E2E request latency"),
    ("Prompt tokens/s", f"rate(vllm:prompt_tokens_total{{{M}}}[{R}])"),
    ("Generation tokens/s", f"rate(vllm:generation_tokens_total{{{M}}}[{R}])"),
    *_quantiles("vllm:inter_token_latency_seconds", "Inter-token latency"),
    *_quantiles("vllm:request_time_per_output_token_seconds", "Time per output token"),
    ("Requests running", f"vllm:num_requests_running{{{M}}}"),
    ("Requests waiting", f"vllm:num_requests_waiting{{{M}}}"),
    *_quantiles("vllm:time_to_first_token_seconds", "Time to first token"),
    ("KV cache usage", f"vllm:kv_cache_usage_perc{{{M}}}"),
    ("Prompt length", f"sum by (le) (increase(vllm:request_prompt_tokens_bucket{{{M}}}[{R}]))"),
    ("Generation length", f"sum by (le) (increase(vllm:request_generation_tokens_bucket{{{M}}}[{R}]))"),
    ("Finish reason", f"sum by (finished_reason) (increase(vllm:request_success_total{{{M}}}[{R}]))"),
    ("Queue time", f"sum(rate(vllm:request_queue_time_seconds_sum{{{M}}}[{R}]))"),
    ("Prefill time", f"sum(rate(vllm:request_prefill_time_seconds_sum{{{M}}}[{R}]))"),
    ("Decode time", f"sum(rate(vllm:request_decode_time_seconds_sum{{{M}}}[{R}]))"),
    ("Inference time", f"sum(rate(vllm:request_inference_time_seconds_sum{{{M}}}[{R}]))"),
    ("Tokens per step p50",
     f"histogram_quantile(0.5, sum by (le) (rate(vllm:iteration_tokens_total_bucket{{{M}}}[{R}])))"),
    ("Preemptions/s", f"rate(vllm:num_preemptions_total{{{M}}}[{R}])"),
    ("Prefix cache hit rate", f"sum(rate(vllm:prefix_cache_hits_total{{{M}}}[{R}])) / "
                              f"sum(rate(vllm:prefix_cache_queries_total{{{M}}}[{R}]))"),
    ("Draft acceptance rate", f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{M}}}[{R}])) / "
                              f"sum(rate(vllm:spec_decode_num_draft_tokens_total{{{M}}}[{R}]))"),
    ("Mean acceptance length", f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{M}}}[{R}])) / "
                               f"sum(rate(vllm:spec_decode_num_drafts_total{{{M}}}[{R}]))"),
    ("Acceptance by position", f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{M}}}"
                               f"[{R}])) / ignoring(position) group_left() "
                               f"sum(rate(vllm:spec_decode_num_drafts_total{{{M}}}[{R}]))"),
]


def vllm_queries(model_name: str, rate_interval: str = "1m") -> list[tuple[str, str]]:
    """[(title, promql)] with the Grafana variables filled in."""
    return [(t, q.replace("$model_name", model_name).replace("$__rate_interval", rate_interval)) for t, q in QUERIES]
