"""Benchmarks for etweave: a generator of scaled traces (`bench.scale`) and the timing harness (`bench.run`)."""
