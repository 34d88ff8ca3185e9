"""The harness the tests, the benchmarks and the demo run on; nothing here imports ``tests``.

* the control plane and node: ``controlplane`` (a scenario on a control plane of its own), ``node``
  and ``node_layout`` (a real kubelet node), ``identity``, ``manifests``, ``image``, ``quota``;
* operators as processes: ``operators`` (spawn, scrape /metrics), ``oplog`` (log and profile),
  ``procfs`` (CPU and memory of a process);
* the substrate and cozy-proxy models: ``substrate``, ``lane`` (the real substrate or the model),
  ``loadbalancer``, ``cozyproxy``, ``standin`` (a fast substrate for filling a cold start);
* waiting and following: ``waiting``, ``following``, ``streams``, ``bulk`` (many writes at once);
* metrics: ``apimetrics`` (the API server's request counts), ``slo`` (quantiles and verdicts);
* worlds: ``ea_cluster`` and ``ea_objects`` (EndpointAttachment), ``gpuclass_world`` (GPUClass at
  scale); faults and traces: ``faultproxy``, ``otlp``; what ``kubectl get`` prints: ``tables``;
  unit-test helpers: ``mergepatch``, ``virtualtime``;
* report tables: ``report``.
"""
